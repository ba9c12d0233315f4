/// Something the test server can be told to do to one request.
public enum Fault: Sendable, Equatable {
    /// Send this many body bytes, then close the connection.
    case dropAfter(Int)
    /// Send this many body bytes, then send nothing more while keeping the connection open.
    case stallAfter(Int)
    /// Answer with this status and headers and a small body instead of the resource.
    case status(Int, [String: String])
    /// Answer 200 with the whole body, as a server without range support would.
    case ignoreRange
    /// Claim a range that starts this many bytes after the one asked for (and send those bytes).
    case shiftContentRange(Int)
    /// Send this Content-Range value verbatim on a 206.
    case contentRange(String)
    /// Send this response at this many bytes per second.
    case throttle(Int)
}

/// A file the test server serves at a path, and how it behaves.
public struct Resource: Sendable {
    /// The bytes.
    public var body: [UInt8]
    /// `ETag` to send (nil for none).
    public var etag: String?
    /// `Last-Modified` to send (nil for none).
    public var lastModified: String?
    /// `Content-Disposition` to send.
    public var contentDisposition: String?
    /// Other headers to send with every 200/206.
    public var headers: [String: String]
    /// Whether `Range` requests are honoured.
    public var acceptRanges: Bool
    /// Whether `Content-Length` is sent (false: close-delimited body).
    public var sendLength: Bool
    /// Faults applied to the next requests, one per request, in order.
    public var faults: [Fault]
    /// Throttle per connection, bytes per second (nil: as fast as possible).
    public var bytesPerSecond: Int?
    /// Redirect every request to this location with this status instead of serving a body.
    public var redirect: (status: Int, location: String)?
    /// Requests beyond this many at once get 503 (a server that limits connections).
    public var maxConcurrent: Int?
    /// Requests whose `Range` starts at byte 0 are sent at this rate (the one slow connection).
    public var firstRangeBytesPerSecond: Int?
    /// Requests whose `Range` starts at byte 0 send this many body bytes, then nothing more while
    /// the connection stays open (a connection that stalls near the end of its range).
    public var firstRangeStallAfter: Int?
    /// Answer `If-None-Match`, `If-Match` and `If-Unmodified-Since` as if they were not there (a
    /// server without conditional requests).
    public var ignoresConditionals = false
    /// A load balancer in front of servers that each have their own validators for the same bytes:
    /// each new connection goes to the next one in turn, which sends the ETag (and Last-Modified)
    /// of this list's entry and answers `If-Range` by it.
    public var backendETags: [String]?
    /// Seconds between the response head and the first body byte (a body made on the fly).
    public var firstByteDelay: Double?

    /// A resource; by default with a strong ETag, range support and a Content-Length.
    public init(
        body: [UInt8], etag: String? = "\"v1\"", lastModified: String? = nil, contentDisposition: String? = nil,
        headers: [String: String] = [:], acceptRanges: Bool = true, sendLength: Bool = true, faults: [Fault] = [],
        bytesPerSecond: Int? = nil
    ) {
        self.body = body
        self.etag = etag
        self.lastModified = lastModified
        self.contentDisposition = contentDisposition
        self.headers = headers
        self.acceptRanges = acceptRanges
        self.sendLength = sendLength
        self.faults = faults
        self.bytesPerSecond = bytesPerSecond
        self.redirect = nil
    }

    /// A resource that redirects.
    public static func redirect(_ status: Int = 302, to location: String) -> Resource {
        var r = Resource(body: [], etag: nil)
        r.redirect = (status, location)
        return r
    }

    /// Deterministic pseudo-random bytes (the same seed gives the same bytes).
    public static func bytes(count: Int, seed: UInt64 = 1) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        var x = seed &* 0x9E37_79B9_7F4A_7C15 | 1
        out.withUnsafeMutableBytes { raw in
            var i = 0
            while i + 8 <= count {
                x ^= x << 13
                x ^= x >> 7
                x ^= x << 17
                raw.storeBytes(of: x, toByteOffset: i, as: UInt64.self)
                i += 8
            }
            while i < count {
                x ^= x << 13
                x ^= x >> 7
                x ^= x << 17
                raw[i] = UInt8(truncatingIfNeeded: x)
                i += 1
            }
        }
        return out
    }
}

/// A request the server received.
public struct RecordedRequest: Sendable {
    /// The path, with the query.
    public var uri: String
    /// Header fields, names lower-cased.
    public var headers: [String: String]
    /// Status sent.
    public var status: Int
    /// Body bytes sent.
    public var bytesSent: Int
    /// Responses to this path in progress when it arrived.
    public var concurrent: Int = 0
    /// The connection it came on (numbered from 0 in the order of their first requests).
    public var connection: Int = 0
}
