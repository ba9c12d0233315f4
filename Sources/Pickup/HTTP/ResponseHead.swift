import HTTPTypes

/// The status and header fields of a response, independent of the HTTP library underneath.
public struct ResponseHead: Sendable, Equatable {
    /// The status code.
    public var status: Int
    /// Header fields in the order received, names as sent (HTTPTypes' `HTTPFields`: looked up by
    /// name as HTTP compares names, without regard to case).
    public var fields: HTTPFields

    /// A response head.
    public init(status: Int, fields: HTTPFields) {
        self.status = status
        self.fields = fields
    }

    /// A response head from name-value pairs (a URLSession's, an FTP answer put as HTTP's). A
    /// field whose name is not a token cannot be one of those a download reads, and is left out.
    public init(status: Int, headers: [(name: String, value: String)]) {
        self.init(status: status, fields: HTTPFields(headers.compactMap { h in HTTPField.Name(h.name).map { HTTPField(name: $0, value: h.value) } }))
    }

    /// The first value of a field.
    public subscript(_ name: HTTPField.Name) -> String? { fields[values: name].first }

    /// The first value of a field, by name (nil for a name that is not a token).
    public subscript(_ name: String) -> String? { HTTPField.Name(name).flatMap { self[$0] } }

    /// Every value of a field, in order.
    public func values(_ name: String) -> [String] { HTTPField.Name(name).map { fields[values: $0] } ?? [] }

    /// All values of a field joined with `, ` (RFC 9110 §5.3); nil when absent.
    public func combined(_ name: String) -> String? {
        let values = values(name)
        return values.isEmpty ? nil : values.joined(separator: ", ")
    }

    /// `Content-Length` when present and well formed (and not overridden by chunked framing).
    public var contentLength: Int64? {
        if let te = self[.transferEncoding], te.lowercased().contains("chunked") { return nil }
        guard let v = self[.contentLength] else { return nil }
        return ContentRange.digits(Substring(v).trimmingSpaces)
    }

    /// The validators this response carries.
    public var validators: Validators {
        Validators(etag: self[.eTag], lastModified: self[.lastModified], date: self[.date])
    }
}
