import Foundation
import Pickup
import SystemPackage

// The JSON of the HTTP API (version 1). `openapi.json` describes the same shapes; a test checks
// real responses against it. Times are seconds since 1970 (numbers), sizes are bytes.

/// A download as the API shows it.
public struct APIDownload: Codable, Sendable, Equatable {
    public var id: Int64
    public var url: String
    /// The file's path relative to the download root: the finished file, or the name asked for;
    /// absent while the server has not yet said what the name is.
    public var name: String?
    public var state: String
    public var priority: Int
    public var bytesDone: Int64
    public var totalBytes: Int64?
    public var fraction: Double?
    public var bytesPerSecond: Double
    public var secondsLeft: Double?
    /// Seconds it now waits for a slow server's next byte, when more than the stall timeout.
    public var stallTimeout: Double?
    /// The speed limit that holds it back while it runs: `download` (its own) or `global`;
    /// absent when its speed is the server's or the network's.
    public var limitedBy: String?
    public var error: APIErrorBody?
    public var speedLimit: Int64?
    public var connections: Int?
    public var checksum: String?
    public var addedAt: Double
    public var finishedAt: Double?
    /// The names of the header fields it sends (never their values).
    public var headers: [String]?
    /// Mirrors of the same file (credentials removed).
    public var mirrors: [String]?

    init(_ info: DownloadInfo, root: FilePath) {
        id = info.id.rawValue
        url = DownloadURL.redacted(info.url)
        mirrors = info.mirrors.isEmpty ? nil : info.mirrors.map(DownloadURL.redacted)
        headers = info.options.headers.isEmpty ? nil : info.options.headers.map(\.name)
        switch (info.path, info.destination) {
        case (let path?, _): name = Confinement.relative(path, to: root)
        case (nil, .file(let path)): name = Confinement.relative(path, to: root)
        case (nil, .directory): name = nil
        }
        state = info.state.rawValue
        priority = info.priority
        bytesDone = info.progress.bytesDone
        totalBytes = info.progress.totalBytes
        fraction = info.progress.fraction
        bytesPerSecond = info.progress.bytesPerSecond
        secondsLeft = info.progress.secondsLeft
        stallTimeout = info.state == .running ? info.progress.stallTimeout : nil
        limitedBy = info.state == .running ? info.progress.limitedBy?.rawValue : nil
        error = info.failure.map { APIErrorBody(code: $0.category.rawValue, message: $0.reason) }
        speedLimit = info.speedLimit
        connections = info.connections
        checksum = info.checksum.map { "\($0.algorithm.rawValue)=\($0.hex)" }
        addedAt = info.addedAt.timeIntervalSince1970
        finishedAt = info.finishedAt?.timeIntervalSince1970
    }
}

/// Progress of one running download (the `progress` event).
public struct APIProgress: Codable, Sendable, Equatable {
    public var id: Int64
    public var bytesDone: Int64
    public var totalBytes: Int64?
    public var fraction: Double?
    public var bytesPerSecond: Double
    public var secondsLeft: Double?
    public var stallTimeout: Double?
    /// `download` or `global`: the speed limit that holds it back, if one does.
    public var limitedBy: String?

    init(_ id: DownloadID, _ p: DownloadProgress) {
        self.id = id.rawValue
        bytesDone = p.bytesDone
        totalBytes = p.totalBytes
        fraction = p.fraction
        bytesPerSecond = p.bytesPerSecond
        secondsLeft = p.secondsLeft
        stallTimeout = p.stallTimeout
        limitedBy = p.limitedBy?.rawValue
    }
}

/// Sums over every download.
public struct APITotals: Codable, Sendable, Equatable {
    public var counts: [String: Int]
    public var bytesDone: Int64
    public var totalBytes: Int64
    public var fraction: Double?
    public var bytesPerSecond: Double
    public var secondsLeft: Double?

    init(_ t: ManagerTotals) {
        counts = Dictionary(uniqueKeysWithValues: DownloadState.allCases.map { ($0.rawValue, t.count($0)) })
        bytesDone = t.bytesDone
        totalBytes = t.totalBytes
        fraction = t.fraction
        bytesPerSecond = t.bytesPerSecond
        secondsLeft = t.secondsLeft
    }
}

/// The first event of the stream.
public struct APISnapshot: Codable, Sendable {
    public var downloads: [APIDownload]
    public var totals: APITotals
}

/// A download's id alone (the `removed` event).
public struct APIRef: Codable, Sendable { public var id: Int64 }

/// A message about a download (the `notice` event).
public struct APINotice: Codable, Sendable {
    public var id: Int64
    public var message: String
}

/// The daemon's settings; every field is written out, `speedLimit` as null when there is none.
public struct APISettings: Codable, Sendable, Equatable {
    public var maxConcurrentDownloads: Int
    /// Global limit in bytes per second, or nil for none.
    public var speedLimit: Int64?
    /// The proxy every download goes through (`http://`, `socks5://`, `socks5h://`), or nil for
    /// what `pickup serve` was started with (`--proxy`, the environment). Shown with its password
    /// as `***`.
    public var proxy: String?
    /// Whether `http://` URLs go through the HTTP proxy in a CONNECT tunnel (as `https://` ones
    /// always do) rather than in absolute form; nil for what `pickup serve` was started with.
    public var proxyTunnel: Bool?
    /// `fifo` or `lifo`: which of the waiting downloads of equal priority starts first.
    public var order: String
    /// Batch mode: every waiting download starts at once, whatever `maxConcurrentDownloads` says.
    public var startsAllAtOnce: Bool

    public init(maxConcurrentDownloads: Int, speedLimit: Int64?, proxy: String? = nil, proxyTunnel: Bool? = nil,
                order: String = "fifo", startsAllAtOnce: Bool = false) {
        self.maxConcurrentDownloads = maxConcurrentDownloads
        self.speedLimit = speedLimit
        self.proxy = proxy
        self.proxyTunnel = proxyTunnel
        self.order = order
        self.startsAllAtOnce = startsAllAtOnce
    }

    enum CodingKeys: String, CodingKey { case maxConcurrentDownloads, speedLimit, proxy, proxyTunnel, order, startsAllAtOnce }

    /// Reads the API's answer or a settings file (one saved before `order` and `startsAllAtOnce`
    /// existed reads as FIFO, not in batch mode).
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        maxConcurrentDownloads = try c.decode(Int.self, forKey: .maxConcurrentDownloads)
        speedLimit = try c.decodeIfPresent(Int64.self, forKey: .speedLimit)
        proxy = try c.decodeIfPresent(String.self, forKey: .proxy)
        proxyTunnel = try c.decodeIfPresent(Bool.self, forKey: .proxyTunnel)
        order = try c.decodeIfPresent(String.self, forKey: .order) ?? "fifo"
        startsAllAtOnce = try c.decodeIfPresent(Bool.self, forKey: .startsAllAtOnce) ?? false
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(maxConcurrentDownloads, forKey: .maxConcurrentDownloads)
        try c.encode(speedLimit, forKey: .speedLimit)
        try c.encode(proxy, forKey: .proxy)
        try c.encode(proxyTunnel, forKey: .proxyTunnel)
        try c.encode(order, forKey: .order)
        try c.encode(startsAllAtOnce, forKey: .startsAllAtOnce)
    }
}

/// `PATCH /downloads/{id}`: the fields to change.
public struct APIDownloadPatch: Codable, Sendable {
    public var priority: Int?
    /// nil: unchanged; .some(nil): no limit.
    public var speedLimit: Int64??
    /// `front`: the next to start among the waiting ones.
    public var position: String?

    enum CodingKeys: String, CodingKey, CaseIterable { case priority, speedLimit, position }

    public init(priority: Int? = nil, speedLimit: Int64?? = nil, position: String? = nil) {
        self.priority = priority
        self.speedLimit = speedLimit
        self.position = position
    }

    public init(from decoder: any Decoder) throws {
        try StrictKeys.check(decoder, CodingKeys.self)
        let c = try decoder.container(keyedBy: CodingKeys.self)
        priority = try c.decodeIfPresent(Int.self, forKey: .priority)
        speedLimit = try c.decodeNullable(Int64.self, forKey: .speedLimit)
        position = try c.decodeIfPresent(String.self, forKey: .position)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encodeIfPresent(priority, forKey: .priority)
        if let limit = speedLimit { try c.encode(limit, forKey: .speedLimit) }
        try c.encodeIfPresent(position, forKey: .position)
    }
}

/// `DELETE /downloads?state=...`: how many downloads were removed.
public struct APIRemoved: Codable, Sendable, Equatable {
    public var removed: Int
    public init(removed: Int) { self.removed = removed }
}

/// An error's stable code and readable message.
public struct APIErrorBody: Codable, Sendable, Equatable {
    public var code: String
    public var message: String
}

/// Every error response: `{"error": {"code": ..., "message": ...}}`.
public struct APIErrorEnvelope: Codable, Sendable {
    public var error: APIErrorBody
}

// MARK: - Request bodies

/// `POST /downloads`.
public struct APIAddRequest: Codable, Sendable {
    /// The URL (or give `urls`).
    public var url: String
    /// Mirrors of the same file; without `url`, the first of them is the URL.
    public var urls: [String]?
    /// A file name or a relative path inside the download root (else the server's name).
    public var name: String?
    public var priority: Int?
    /// `sha-256=HEX` (also sha-512, sha-1, md5).
    public var checksum: String?
    /// 1 to 32.
    public var connections: Int?
    /// Bytes per second.
    public var speedLimit: Int64?
    /// Add it paused.
    public var paused: Bool?
    /// Header fields to send with every request (name to value); `Authorization` and `Cookie`
    /// only to the URL's own origin. Listings show the names only.
    public var headers: [String: String]?

    enum CodingKeys: String, CodingKey, CaseIterable {
        case url, urls, name, priority, checksum, connections, speedLimit, paused, headers
    }

    public init(url: String, name: String? = nil, priority: Int? = nil, checksum: String? = nil,
                connections: Int? = nil, speedLimit: Int64? = nil, paused: Bool? = nil, headers: [String: String]? = nil,
                urls: [String]? = nil) {
        self.urls = urls
        self.headers = headers
        self.url = url
        self.name = name
        self.priority = priority
        self.checksum = checksum
        self.connections = connections
        self.speedLimit = speedLimit
        self.paused = paused
    }

    public init(from decoder: any Decoder) throws {
        try StrictKeys.check(decoder, CodingKeys.self)
        let c = try decoder.container(keyedBy: CodingKeys.self)
        urls = try c.decodeIfPresent([String].self, forKey: .urls)
        if let first = urls?.first, !c.contains(.url) {
            url = first
            urls = Array(urls!.dropFirst())
        } else {
            url = try c.decode(String.self, forKey: .url)
        }
        name = try c.decodeIfPresent(String.self, forKey: .name)
        priority = try c.decodeIfPresent(Int.self, forKey: .priority)
        checksum = try c.decodeIfPresent(String.self, forKey: .checksum)
        connections = try c.decodeIfPresent(Int.self, forKey: .connections)
        speedLimit = try c.decodeIfPresent(Int64.self, forKey: .speedLimit)
        paused = try c.decodeIfPresent(Bool.self, forKey: .paused)
        headers = try c.decodeIfPresent([String: String].self, forKey: .headers)
    }
}

/// `PATCH /settings`: fields left out stay as they are; `"speedLimit": null` removes the limit.
public struct APISettingsPatch: Codable, Sendable {
    public var maxConcurrentDownloads: Int?
    /// nil: unchanged; .some(nil): no limit.
    public var speedLimit: Int64??
    /// nil: unchanged; .some(nil): back to what `pickup serve` was started with.
    public var proxy: String??
    /// nil: unchanged; .some(nil): back to what `pickup serve` was started with.
    public var proxyTunnel: Bool??
    /// `fifo` or `lifo`.
    public var order: String?
    public var startsAllAtOnce: Bool?

    enum CodingKeys: String, CodingKey, CaseIterable { case maxConcurrentDownloads, speedLimit, proxy, proxyTunnel, order, startsAllAtOnce }

    public init(maxConcurrentDownloads: Int? = nil, speedLimit: Int64?? = nil, proxy: String?? = nil, proxyTunnel: Bool?? = nil,
                order: String? = nil, startsAllAtOnce: Bool? = nil) {
        self.maxConcurrentDownloads = maxConcurrentDownloads
        self.speedLimit = speedLimit
        self.proxy = proxy
        self.proxyTunnel = proxyTunnel
        self.order = order
        self.startsAllAtOnce = startsAllAtOnce
    }

    public init(from decoder: any Decoder) throws {
        try StrictKeys.check(decoder, CodingKeys.self)
        let c = try decoder.container(keyedBy: CodingKeys.self)
        maxConcurrentDownloads = try c.decodeIfPresent(Int.self, forKey: .maxConcurrentDownloads)
        speedLimit = try c.decodeNullable(Int64.self, forKey: .speedLimit)
        proxy = try c.decodeNullable(String.self, forKey: .proxy)
        proxyTunnel = try c.decodeNullable(Bool.self, forKey: .proxyTunnel)
        order = try c.decodeIfPresent(String.self, forKey: .order)
        startsAllAtOnce = try c.decodeIfPresent(Bool.self, forKey: .startsAllAtOnce)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encodeIfPresent(maxConcurrentDownloads, forKey: .maxConcurrentDownloads)
        if let limit = speedLimit { try c.encode(limit, forKey: .speedLimit) }
        if let proxy { try c.encode(proxy, forKey: .proxy) }
        if let proxyTunnel { try c.encode(proxyTunnel, forKey: .proxyTunnel) }
        try c.encodeIfPresent(order, forKey: .order)
        try c.encodeIfPresent(startsAllAtOnce, forKey: .startsAllAtOnce)
    }
}

/// Refuses fields a request body should not have (a misspelt field would otherwise be ignored).
enum StrictKeys {
    struct AnyKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    static func check<K: CodingKey & CaseIterable>(_ decoder: any Decoder, _: K.Type) throws {
        let known = Set(K.allCases.map(\.stringValue))
        let c = try decoder.container(keyedBy: AnyKey.self)
        if let unknown = c.allKeys.first(where: { !known.contains($0.stringValue) }) {
            throw DecodingError.dataCorrupted(.init(codingPath: [unknown], debugDescription: "unknown field"))
        }
    }
}


// MARK: - Fast JSON for lists

extension APIDownload {
    func write(to w: inout JSONWriter) {
        w.raw(#"{"id":"#); w.number(id)
        w.raw(#","url":"#); w.string(url)
        if let headers { Self.strings(headers, as: "headers", to: &w) }
        if let name { w.raw(#","name":"#); w.string(name) }
        w.raw(#","state":"#); w.string(state)
        w.raw(#","priority":"#); w.number(priority)
        w.raw(#","bytesDone":"#); w.number(bytesDone)
        if let totalBytes { w.raw(#","totalBytes":"#); w.number(totalBytes) }
        if let fraction { w.raw(#","fraction":"#); w.number(fraction) }
        w.raw(#","bytesPerSecond":"#); w.number(bytesPerSecond)
        if let secondsLeft { w.raw(#","secondsLeft":"#); w.number(secondsLeft) }
        if let stallTimeout { w.raw(#","stallTimeout":"#); w.number(stallTimeout) }
        if let limitedBy { w.raw(#","limitedBy":"#); w.string(limitedBy) }
        if let error {
            w.raw(#","error":{"code":"#); w.string(error.code)
            w.raw(#","message":"#); w.string(error.message)
            w.raw("}")
        }
        if let speedLimit { w.raw(#","speedLimit":"#); w.number(speedLimit) }
        if let connections { w.raw(#","connections":"#); w.number(connections) }
        if let checksum { w.raw(#","checksum":"#); w.string(checksum) }
        if let mirrors { Self.strings(mirrors, as: "mirrors", to: &w) }
        w.raw(#","addedAt":"#); w.number(addedAt)
        if let finishedAt { w.raw(#","finishedAt":"#); w.number(finishedAt) }
        w.raw("}")
    }

    /// `,"key":[...]` of strings.
    static func strings(_ values: [String], as key: StaticString, to w: inout JSONWriter) {
        w.raw(#",""#); w.raw(key); w.raw(#"":["#)
        for (i, v) in values.enumerated() {
            if i > 0 { w.raw(",") }
            w.string(v)
        }
        w.raw("]")
    }

    /// `[...]` of `downloads`, as JSON bytes.
    static func json(_ downloads: some Collection<APIDownload>) -> [UInt8] {
        var w = JSONWriter(capacity: 64 + downloads.count * 256)
        w.raw("[")
        for (i, d) in downloads.enumerated() {
            if i > 0 { w.raw(",") }
            d.write(to: &w)
        }
        w.raw("]")
        return w.bytes
    }
}

extension KeyedDecodingContainer {
    /// A field a PATCH may leave out (nil: unchanged), set to null (`.some(nil)`), or set.
    func decodeNullable<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T?? {
        guard contains(key) else { return nil }
        return .some(try decodeNil(forKey: key) ? nil : try decode(T.self, forKey: key))
    }
}
