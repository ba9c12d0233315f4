import Foundation

// aria2's JSON-RPC as the daemon speaks it (`pickup serve --aria2-rpc`): the wire format, parsed
// and decoded into values with no I/O, so that every rule here is tested without a server. What
// the calls do is ``Aria2Service``'s (Aria2Server.swift); what Pickup's downloads look like to an
// aria2 client is Aria2Mapping.swift's.

/// A JSON value as aria2's RPC carries it (aria2 has no floating point; a number with a fraction
/// is kept as `double` and refused wherever an integer is expected).
enum RPCValue: Sendable, Equatable, Codable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([RPCValue])
    case object([String: RPCValue])

    init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let i = try? c.decode(Int64.self) { self = .int(i) }
        else if let d = try? c.decode(Double.self) { self = .double(d) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([RPCValue].self) { self = .array(a) }
        else { self = .object(try c.decode([String: RPCValue].self)) }
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .null: try c.encodeNil()
        case .bool(let b): try c.encode(b)
        case .int(let i): try c.encode(i)
        case .double(let d): try c.encode(d)
        case .string(let s): try c.encode(s)
        case .array(let a): try c.encode(a)
        case .object(let o): try c.encode(o)
        }
    }

    var string: String? { if case .string(let s) = self { s } else { nil } }
    var int: Int64? { if case .int(let i) = self { i } else { nil } }
    var array: [RPCValue]? { if case .array(let a) = self { a } else { nil } }
    var object: [String: RPCValue]? { if case .object(let o) = self { o } else { nil } }

    /// `[String: String]` as an object of strings (aria2's structs: every value a string).
    static func strings(_ d: [String: String]) -> RPCValue { .object(d.mapValues(RPCValue.string)) }

    /// The value as JSON bytes (keys sorted: the same answer for the same state).
    var json: Data {
        (try? RPCValue.encoder.encode(self)) ?? Data("null".utf8)
    }

    static let encoder: JSONEncoder = {
        let e = JSONEncoder()
        e.outputFormatting = [.withoutEscapingSlashes, .sortedKeys]
        return e
    }()
}

/// An error a call answers with: aria2's `{"code": 1, "message": ...}` for anything a method
/// refuses, JSON-RPC's negative codes for a request that is not one.
struct Aria2Fault: Error, Equatable, Sendable {
    let code: Int
    let message: String

    init(_ message: String, code: Int = 1) {
        self.code = code
        self.message = message
    }

    static let unauthorized = Aria2Fault("Unauthorized")
    static let parseError = Aria2Fault("Parse error.", code: -32700)
    static let invalidRequest = Aria2Fault("Invalid Request.", code: -32600)
    static let invalidParams = Aria2Fault("Invalid params.", code: -32602)

    static func noSuchMethod(_ name: String) -> Aria2Fault { Aria2Fault("No such method: \(Aria2Fault.shown(name))") }
    static func wrongType(_ index: Int) -> Aria2Fault { Aria2Fault("The parameter at \(index) has wrong type.") }
    static func missing(_ index: Int) -> Aria2Fault { Aria2Fault("The parameter at \(index) is required but missing.") }

    /// A client's text in a message: at most 64 characters, so an answer never grows with what a
    /// hostile client sent.
    static func shown(_ text: String) -> String {
        text.count <= 64 ? text : String(text.prefix(64)) + "..."
    }

    var value: RPCValue { .object(["code": .int(Int64(code)), "message": .string(message)]) }
}

/// A GID: aria2's 64-bit key of a download, 16 lower-case hex digits on the wire. A Pickup
/// download's GID is its ``DownloadID`` (the manager's row id, stable across restarts) as those
/// 64 bits, so it maps back without a table.
struct GID: Hashable, Sendable, Comparable, CustomStringConvertible {
    let bits: UInt64

    init(_ bits: UInt64) { self.bits = bits }

    /// Exactly 16 hex digits (aria2 also takes a unique prefix; Pickup's clients send whole GIDs).
    init?(hex: String) {
        guard hex.utf8.count == 16, hex.utf8.allSatisfy({ $0 < 0x80 && (Character(UnicodeScalar($0)).isHexDigit) }),
            let n = UInt64(hex, radix: 16)
        else { return nil }
        bits = n
    }

    var description: String {
        let h = String(bits, radix: 16)
        return String(repeating: "0", count: 16 - h.count) + h
    }

    static func < (a: GID, b: GID) -> Bool { a.bits < b.bits }
}

/// One JSON-RPC request object: its id (any JSON, echoed), the method's name and its params.
struct Aria2Request: Sendable, Equatable {
    var id: RPCValue
    var method: String
    var params: [RPCValue]

    /// What a request body is: one request, a batch of them, or an answer already (a body that
    /// is not JSON, or not a request).
    enum Body: Sendable, Equatable {
        case single(Result<Aria2Request, Answer>)
        case batch([Result<Aria2Request, Answer>])
        case invalid(Answer)
    }

    /// An answer to one request: its id and the result or the fault.
    struct Answer: Error, Sendable, Equatable {
        var id: RPCValue
        var outcome: Result<RPCValue, Aria2Fault>

        var value: RPCValue {
            switch outcome {
            case .success(let r): .object(["id": id, "jsonrpc": .string("2.0"), "result": r])
            case .failure(let f): .object(["id": id, "jsonrpc": .string("2.0"), "error": f.value])
            }
        }
    }

    /// Requests in one batch, and calls in one `system.multicall`, at most.
    static let maxCalls = 1000

    /// Parses a request body as aria2 does: not JSON is -32700; an object without an id, or
    /// whose method is not a string, is -32600; params that are not an array are -32602; a batch
    /// skips what is not an object. Never traps, whatever the bytes.
    static func parse(_ data: Data) -> Body {
        guard let value = try? JSONDecoder().decode(RPCValue.self, from: data) else {
            return .invalid(Answer(id: .null, outcome: .failure(.parseError)))
        }
        switch value {
        case .object(let o):
            return .single(request(o))
        case .array(let items):
            guard items.count <= maxCalls else {
                return .invalid(Answer(id: .null, outcome: .failure(Aria2Fault("at most \(maxCalls) requests in a batch"))))
            }
            return .batch(items.compactMap { $0.object.map(request) })
        default:
            return .invalid(Answer(id: .null, outcome: .failure(.invalidRequest)))
        }
    }

    static func request(_ o: [String: RPCValue]) -> Result<Aria2Request, Answer> {
        guard let id = o["id"] else { return .failure(Answer(id: .null, outcome: .failure(.invalidRequest))) }
        guard let method = o["method"]?.string else { return .failure(Answer(id: id, outcome: .failure(.invalidRequest))) }
        let params: [RPCValue]
        switch o["params"] {
        case nil: params = []
        case .array(let a)?: params = a
        default: return .failure(Answer(id: id, outcome: .failure(.invalidParams)))
        }
        return .success(Aria2Request(id: id, method: method, params: params))
    }

    /// A GET request's query (`method`, `id`, `params` as base64 of a JSON array; or `params`
    /// alone with a whole batch), as the body it stands for.
    static func fromQuery(method: String?, id: String?, params: String?) -> Data? {
        let decoded = params.flatMap { p -> Data? in
            // aria2 accepts base64 with or without padding; URL-safe characters too.
            var s = p.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
            while s.count % 4 != 0 { s += "=" }
            return Data(base64Encoded: s)
        }
        if params != nil, decoded == nil { return nil }
        guard let method else { return decoded }
        var o: [String: RPCValue] = ["method": .string(method), "id": .string(id ?? "")]
        if id == nil { o["id"] = nil }
        if let decoded {
            guard let p = try? JSONDecoder().decode(RPCValue.self, from: decoded) else { return nil }
            o["params"] = p
        }
        return RPCValue.object(o).json
    }
}

/// The secret: aria2 takes a first param `"token:SECRET"` off every call's params (whether or
/// not a secret is set), and refuses the call unless it matches.
enum Aria2Secret {
    /// The params without a leading `token:` string, and the token it carried (nil: none).
    static func split(_ params: [RPCValue]) -> (token: String?, rest: [RPCValue]) {
        guard let first = params.first?.string, first.hasPrefix("token:") else { return (nil, params) }
        return (String(first.dropFirst("token:".count)), Array(params.dropFirst()))
    }

    /// Whether `token` is the secret, compared in constant time (as the API's bearer token).
    static func matches(_ token: String?, secret: [UInt8]) -> Bool {
        guard let token else { return false }
        return ConstantTime.equal(Array(token.utf8), secret)
    }
}

/// A method of aria2's that Pickup answers, with its params decoded and checked (after the
/// secret was taken off). Decoding never touches a download: ``Aria2Service`` carries it out.
enum Aria2Call: Sendable, Equatable {
    case addUri(uris: [String], options: [String: RPCValue], position: Int64?)
    case addMetalink(document: Data, options: [String: RPCValue], position: Int64?)
    case remove(GID, force: Bool)
    case pause(GID, force: Bool)
    case pauseAll(force: Bool)
    case unpause(GID)
    case unpauseAll
    case tellStatus(GID, keys: Set<String>?)
    case tellActive(keys: Set<String>?)
    case tellWaiting(offset: Int64, num: Int64, keys: Set<String>?)
    case tellStopped(offset: Int64, num: Int64, keys: Set<String>?)
    case getFiles(GID)
    case getUris(GID)
    case getPeers(GID)
    case getServers(GID)
    case changePosition(GID, pos: Int64, how: String)
    case getOption(GID)
    case changeOption(GID, options: [String: RPCValue])
    case getGlobalOption
    case changeGlobalOption(options: [String: RPCValue])
    case getGlobalStat
    case purgeDownloadResult
    case removeDownloadResult(GID)
    case getVersion
    case getSessionInfo
    case saveSession

    /// Every method Pickup answers (`system.listMethods`), aria2's names.
    static let methodNames = [
        "aria2.addUri", "aria2.addMetalink", "aria2.remove", "aria2.forceRemove", "aria2.pause", "aria2.pauseAll",
        "aria2.forcePause", "aria2.forcePauseAll", "aria2.unpause", "aria2.unpauseAll", "aria2.tellStatus",
        "aria2.getUris", "aria2.getFiles", "aria2.getPeers", "aria2.getServers", "aria2.tellActive", "aria2.tellWaiting",
        "aria2.tellStopped", "aria2.changePosition", "aria2.getOption", "aria2.changeOption", "aria2.getGlobalOption",
        "aria2.changeGlobalOption", "aria2.getGlobalStat", "aria2.purgeDownloadResult", "aria2.removeDownloadResult",
        "aria2.getVersion", "aria2.getSessionInfo", "aria2.saveSession", "system.multicall", "system.listMethods",
        "system.listNotifications",
    ]

    /// The notifications sent over WebSocket (`system.listNotifications`).
    static let notificationNames = [
        "aria2.onDownloadStart", "aria2.onDownloadPause", "aria2.onDownloadStop", "aria2.onDownloadComplete",
        "aria2.onDownloadError", "aria2.onBtDownloadComplete",
    ]

    /// The call `method` names with `params` (the secret already taken off).
    /// - Throws: aria2's fault for an unknown method, a missing or mistyped param, a bad GID.
    static func decode(_ method: String, _ params: [RPCValue]) throws(Aria2Fault) -> Aria2Call {
        let p = Params(params)
        switch method {
        case "aria2.addUri":
            let uris = try p.required(0, \.array).compactMap(\.string)
            guard !uris.isEmpty else { throw Aria2Fault("URI is not provided.") }
            return .addUri(uris: uris, options: try p.optional(1, \.object) ?? [:], position: try p.position(2))
        case "aria2.addMetalink":
            let text = try p.required(0, \.string)
            guard let document = Data(base64Encoded: text, options: .ignoreUnknownCharacters) else {
                throw Aria2Fault("the metalink parameter must be base64")
            }
            return .addMetalink(document: document, options: try p.optional(1, \.object) ?? [:], position: try p.position(2))
        case "aria2.remove": return .remove(try p.gid(0), force: false)
        case "aria2.forceRemove": return .remove(try p.gid(0), force: true)
        case "aria2.pause": return .pause(try p.gid(0), force: false)
        case "aria2.forcePause": return .pause(try p.gid(0), force: true)
        case "aria2.pauseAll": return .pauseAll(force: false)
        case "aria2.forcePauseAll": return .pauseAll(force: true)
        case "aria2.unpause": return .unpause(try p.gid(0))
        case "aria2.unpauseAll": return .unpauseAll
        case "aria2.tellStatus": return .tellStatus(try p.gid(0), keys: try p.keys(1))
        case "aria2.tellActive": return .tellActive(keys: try p.keys(0))
        case "aria2.tellWaiting", "aria2.tellStopped":
            let offset = try p.required(0, \.int)
            let num = try p.required(1, \.int)
            guard num >= 0 else {
                throw Aria2Fault("The integer parameter at 1 has invalid value: the value must be greater than or equal to 0.")
            }
            let keys = try p.keys(2)
            return method == "aria2.tellWaiting" ? .tellWaiting(offset: offset, num: num, keys: keys)
                : .tellStopped(offset: offset, num: num, keys: keys)
        case "aria2.getFiles": return .getFiles(try p.gid(0))
        case "aria2.getUris": return .getUris(try p.gid(0))
        case "aria2.getPeers": return .getPeers(try p.gid(0))
        case "aria2.getServers": return .getServers(try p.gid(0))
        case "aria2.changePosition":
            return .changePosition(try p.gid(0), pos: try p.required(1, \.int), how: try p.required(2, \.string))
        case "aria2.getOption": return .getOption(try p.gid(0))
        case "aria2.changeOption": return .changeOption(try p.gid(0), options: try p.required(1, \.object))
        case "aria2.getGlobalOption": return .getGlobalOption
        case "aria2.changeGlobalOption": return .changeGlobalOption(options: try p.required(0, \.object))
        case "aria2.getGlobalStat": return .getGlobalStat
        case "aria2.purgeDownloadResult": return .purgeDownloadResult
        case "aria2.removeDownloadResult": return .removeDownloadResult(try p.gid(0))
        case "aria2.getVersion": return .getVersion
        case "aria2.getSessionInfo": return .getSessionInfo
        case "aria2.saveSession": return .saveSession
        default: throw .noSuchMethod(method)
        }
    }

    /// Params by position, checked as aria2's `checkParam` does.
    struct Params {
        let values: [RPCValue]
        init(_ values: [RPCValue]) { self.values = values }

        func optional<T>(_ i: Int, _ kind: KeyPath<RPCValue, T?>) throws(Aria2Fault) -> T? {
            guard i < values.count else { return nil }
            guard let v = values[i][keyPath: kind] else { throw .wrongType(i) }
            return v
        }

        func required<T>(_ i: Int, _ kind: KeyPath<RPCValue, T?>) throws(Aria2Fault) -> T {
            guard let v = try optional(i, kind) else { throw .missing(i) }
            return v
        }

        func gid(_ i: Int) throws(Aria2Fault) -> GID {
            let text = try required(i, \.string)
            guard let gid = GID(hex: text) else { throw Aria2Fault("Invalid GID \(Aria2Fault.shown(text))") }
            return gid
        }

        /// The keys filter: the strings of an array (others skipped); nil or empty: every key.
        func keys(_ i: Int) throws(Aria2Fault) -> Set<String>? {
            let keys = Set(try optional(i, \.array)?.compactMap(\.string) ?? [])
            return keys.isEmpty ? nil : keys
        }

        func position(_ i: Int) throws(Aria2Fault) -> Int64? {
            guard let pos = try optional(i, \.int) else { return nil }
            guard pos >= 0 else { throw Aria2Fault("Position must be greater than or equal to 0.") }
            return pos
        }
    }
}
