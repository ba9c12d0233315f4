import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import SystemPackage

/// Why a call to the daemon failed.
public enum DaemonClientError: Error, CustomStringConvertible, Sendable {
    /// No daemon has written its address in this state directory.
    case noDaemon(String)
    /// The daemon's address did not answer.
    case unreachable(String)
    /// The daemon answered with an error.
    case api(status: Int, code: String, message: String)

    public var description: String {
        switch self {
        case .noDaemon(let dir): "no daemon is running with its state in \(dir) (start one with 'pickup serve')"
        case .unreachable(let why): "cannot reach the daemon: \(why)"
        case .api(let status, let code, let message): "the daemon said \(status) \(code): \(message)"
        }
    }
}

/// Talks to a running daemon's API: what `pickup add/ls/pause/resume/rm/watch` use.
public struct DaemonClient: Sendable {
    /// `http://host:port`.
    public let baseURL: String
    let token: String
    /// How long one API call may take (tests on a loaded machine, whose daemon fsyncs behind
    /// other tests' writes, give it longer).
    var requestTimeout: TimeAmount = .seconds(30)

    /// A client of the daemon at `baseURL`.
    public init(baseURL: String, token: String) {
        self.baseURL = baseURL
        self.token = token
    }

    /// The client of the daemon whose state is in `stateDirectory` (its address and token are there).
    public static func find(stateDirectory: FilePath) throws(DaemonClientError) -> DaemonClient {
        let files = DaemonFiles(directory: stateDirectory)
        guard let url = files.readAddress(), let token = files.readToken() else { throw .noDaemon(stateDirectory.string) }
        return DaemonClient(baseURL: url, token: token)
    }

    public func add(_ request: APIAddRequest) async throws -> APIDownload {
        try await call(.POST, "/downloads", body: request)
    }

    public func list(state: String? = nil, url: String? = nil) async throws -> [APIDownload] {
        let query = [state.map { "state=" + Self.escape($0) }, url.map { "url=" + Self.escape($0) }].compactMap { $0 }
        return try await call(.GET, "/downloads" + (query.isEmpty ? "" : "?" + query.joined(separator: "&")))
    }

    /// Changes a download's priority or speed limit, or moves it to the front.
    public func change(_ id: Int64, _ patch: APIDownloadPatch) async throws -> APIDownload {
        try await call(.PATCH, "/downloads/\(id)", body: patch)
    }

    /// Removes every download in `state` (`completed` or `failed`); their finished files only with
    /// `deleteFile`, the failed ones' partial files only with `deletePartial`.
    public func removeAll(state: String, deleteFile: Bool, deletePartial: Bool = false) async throws -> APIRemoved {
        try await call(.DELETE, "/downloads?state=\(Self.escape(state))&deleteFile=\(deleteFile)&deletePartial=\(deletePartial)")
    }

    /// A query value, percent-encoded but for unreserved characters.
    public static func escape(_ value: String) -> String {
        var allowed = CharacterSet.alphanumerics.intersection(CharacterSet(charactersIn: Unicode.Scalar(0)...Unicode.Scalar(127)))
        allowed.insert(charactersIn: "-._~")
        return value.addingPercentEncoding(withAllowedCharacters: allowed) ?? value
    }

    public func download(_ id: Int64) async throws -> APIDownload {
        try await call(.GET, "/downloads/\(id)")
    }

    public func pause(_ id: Int64) async throws -> APIDownload { try await call(.POST, "/downloads/\(id)/pause") }
    public func resume(_ id: Int64) async throws -> APIDownload { try await call(.POST, "/downloads/\(id)/resume") }
    public func retry(_ id: Int64) async throws -> APIDownload { try await call(.POST, "/downloads/\(id)/retry") }
    public func pauseAll() async throws { _ = try await send(.POST, "/pause-all", body: nil) }
    public func resumeAll() async throws { _ = try await send(.POST, "/resume-all", body: nil) }

    /// Removes a download; its finished file only with `deleteFile`, an unfinished one's partial
    /// file (and its control and cursor files) only with `deletePartial`.
    public func remove(_ id: Int64, deleteFile: Bool, deletePartial: Bool = false) async throws {
        _ = try await send(.DELETE, "/downloads/\(id)?deleteFile=\(deleteFile)&deletePartial=\(deletePartial)", body: nil)
    }

    public func settings() async throws -> APISettings { try await call(.GET, "/settings") }

    public func update(_ patch: APISettingsPatch) async throws -> APISettings { try await call(.PATCH, "/settings", body: patch) }

    /// The event stream: each event's name and its JSON data, until the daemon ends it.
    public func events() -> AsyncThrowingStream<(event: String, data: Data), any Error> {
        AsyncThrowingStream { continuation in
            let task = Task {
                do {
                    let response = try await Self.streaming.execute(request(.GET, "/events"), timeout: .hours(24 * 365))
                    guard response.status == .ok else { throw try await failure(response) }
                    var parser = SSEParser()
                    for try await buffer in response.body {
                        for event in parser.feed(buffer.readableBytesView) { continuation.yield(event) }
                    }
                    continuation.finish()
                } catch let e as DaemonClientError {
                    continuation.finish(throwing: e)
                } catch {
                    continuation.finish(throwing: DaemonClientError.unreachable("\(baseURL): \(error)"))
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    // MARK: - Plumbing

    /// A client without a read timeout, for the event stream, which may stay quiet for as long as
    /// nothing changes (the shared client gives up after 90 s without a byte). Lives as long as
    /// the process.
    static let streaming = HTTPClient(
        eventLoopGroupProvider: .singleton,
        configuration: HTTPClient.Configuration(timeout: .init(connect: .seconds(10), read: nil)))

    func request(_ method: HTTPMethod, _ path: String, body: (any Encodable)? = nil) throws -> HTTPClientRequest {
        var r = HTTPClientRequest(url: baseURL + "/api/v1" + path)
        r.method = method
        r.headers.add(name: "Authorization", value: "Bearer \(token)")
        if let body {
            r.headers.add(name: "Content-Type", value: "application/json")
            r.body = .bytes(ByteBuffer(bytes: try JSONEncoder().encode(body)))
        }
        return r
    }

    func send(_ method: HTTPMethod, _ path: String, body: (any Encodable)?) async throws -> Data {
        let response: HTTPClientResponse
        do {
            response = try await HTTPClient.shared.execute(request(method, path, body: body), timeout: requestTimeout)
        } catch {
            throw DaemonClientError.unreachable("\(baseURL): \(error)")
        }
        guard (200..<300).contains(response.status.code) else { throw try await failure(response) }
        let buffer = try await response.body.collect(upTo: 256 * 1024 * 1024)
        return Data(buffer.readableBytesView)
    }

    func call<T: Decodable>(_ method: HTTPMethod, _ path: String, body: (any Encodable)? = nil) async throws -> T {
        try JSONDecoder().decode(T.self, from: try await send(method, path, body: body))
    }

    func failure(_ response: HTTPClientResponse) async throws -> DaemonClientError {
        let buffer = try await response.body.collect(upTo: 1 << 20)
        let e = try? JSONDecoder().decode(APIErrorEnvelope.self, from: Data(buffer.readableBytesView))
        return .api(status: Int(response.status.code), code: e?.error.code ?? "http_\(response.status.code)",
                    message: e?.error.message ?? response.status.reasonPhrase)
    }
}

/// Splits a `text/event-stream` into events (name and data); comments and ids are skipped.
struct SSEParser {
    private var line: [UInt8] = []
    private var event = "message"
    private var data: [UInt8] = []
    private var hasData = false

    mutating func feed(_ bytes: some Sequence<UInt8>) -> [(event: String, data: Data)] {
        var out: [(event: String, data: Data)] = []
        for b in bytes {
            if b != UInt8(ascii: "\n") {
                line.append(b)
                continue
            }
            if line.last == UInt8(ascii: "\r") { line.removeLast() }
            if line.isEmpty {
                if hasData { out.append((event, Data(data))) }
                event = "message"
                data = []
                hasData = false
            } else if line.starts(with: Array("event:".utf8)) {
                event = String(decoding: line.dropFirst(6), as: UTF8.self).trimmingCharacters(in: .whitespaces)
            } else if line.starts(with: Array("data:".utf8)) {
                var value = line.dropFirst(5)
                if value.first == UInt8(ascii: " ") { value = value.dropFirst() }
                if hasData { data.append(UInt8(ascii: "\n")) }
                data.append(contentsOf: value)
                hasData = true
            }
            line.removeAll(keepingCapacity: true)
        }
        return out
    }
}
