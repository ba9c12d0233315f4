/// The status and header fields of a response, independent of the HTTP library underneath.
public struct ResponseHead: Sendable, Equatable {
    /// The status code.
    public var status: Int
    /// Header fields in the order received; names as sent.
    public var headers: [(name: String, value: String)]

    /// A response head.
    public init(status: Int, headers: [(name: String, value: String)]) {
        self.status = status
        self.headers = headers
    }

    /// The first value of a field, by case-insensitive name.
    public subscript(_ name: String) -> String? {
        headers.first(where: { $0.name.caseInsensitiveEquals(name) })?.value
    }

    /// All values of a field joined with `, ` (RFC 9110 §5.3); nil when absent.
    public func combined(_ name: String) -> String? {
        let values = headers.filter { $0.name.caseInsensitiveEquals(name) }.map(\.value)
        return values.isEmpty ? nil : values.joined(separator: ", ")
    }

    /// `Content-Length` when present and well formed (and not overridden by chunked framing).
    public var contentLength: Int64? {
        if let te = self["Transfer-Encoding"], te.lowercased().contains("chunked") { return nil }
        guard let v = self["Content-Length"] else { return nil }
        return ContentRange.digits(Substring(v).trimmingSpaces)
    }

    /// The validators this response carries.
    public var validators: Validators {
        Validators(etag: self["ETag"], lastModified: self["Last-Modified"], date: self["Date"])
    }

    public static func == (a: ResponseHead, b: ResponseHead) -> Bool {
        a.status == b.status && a.headers.elementsEqual(b.headers, by: { $0.name == $1.name && $0.value == $1.value })
    }
}

extension String {
    func caseInsensitiveEquals(_ other: String) -> Bool {
        utf8.count == other.utf8.count && lowercased() == other.lowercased()
    }
}
