import Foundation
import Hummingbird
import Pickup
import SystemPackage

// What Pickup's downloads, options and events look like to an aria2 client, and back: pure
// functions of values (no manager, no server), each tested on its own.

/// A download as aria2's `tellStatus` shows it: every number a decimal string, the status one
/// of aria2's six words, URLs without their credentials (``DownloadURL/redacted(_:)``, as the
/// REST API shows them).
enum Aria2Status {
    /// aria2's word for a state; `removed` is aria2's for a download a client removed, which the
    /// manager no longer holds (``Aria2Service`` remembers it as a download result).
    static func word(_ state: DownloadState) -> String {
        switch state {
        case .running: "active"
        case .waiting: "waiting"
        case .paused: "paused"
        case .completed: "complete"
        case .failed: "error"
        }
    }

    /// aria2's exit status (`errorCode`) for why a download failed; the message says the rest.
    static func errorCode(_ category: PickupError.Category) -> String {
        switch category {
        case .usage: "28"  // a bad option
        case .network: "6"  // a network problem
        case .server: "1"  // aria2's 3 (not found) and 22 (a bad answer) cannot be told apart here
        case .verification: "32"  // checksum validation failed
        case .fileSystem: "17"  // a file I/O error
        case .interrupted: "7"  // unfinished
        }
    }

    /// aria2's exit status for a download removed by a client (its `REMOVED` result).
    static let removedCode = "31"

    /// Bytes per piece in the piece counts shown (Pickup's ranges are not pieces; aria2 clients
    /// draw progress from `completedLength`, and this keeps `numPieces` meaningful).
    static let pieceLength: Int64 = 1 << 20

    /// The path of the download's file (the finished file, else the name asked for), when known.
    static func path(_ info: DownloadInfo) -> FilePath? {
        if let path = info.path { return path }
        if case .file(let path) = info.destination { return path }
        return nil
    }

    /// The directory the file goes to.
    static func dir(_ info: DownloadInfo) -> FilePath {
        if let path = path(info) { return path.removingLastComponent() }
        if case .directory(let dir) = info.destination { return dir }
        return FilePath("/")
    }

    /// The `uris` of its file: the URL given first in use, the mirrors waiting, all redacted.
    static func uris(_ info: DownloadInfo) -> RPCValue {
        var list: [RPCValue] = [.strings(["uri": DownloadURL.redacted(info.url), "status": "used"])]
        list += info.mirrors.map { .strings(["uri": DownloadURL.redacted($0), "status": "waiting"]) }
        return .array(list)
    }

    /// `getFiles`: one file.
    static func files(_ info: DownloadInfo) -> RPCValue {
        let length = info.progress.totalBytes ?? 0
        return .array([.object([
            "index": .string("1"),
            "path": .string(path(info)?.string ?? ""),
            "length": .string(String(length)),
            "completedLength": .string(String(info.progress.bytesDone)),
            "selected": .string("true"),
            "uris": uris(info),
        ])])
    }

    /// `tellStatus`'s struct for `info`, with only `keys` when given. `removed`: a download a
    /// client removed (shown as aria2 shows its result). `connections`: the download's, else the
    /// engine's setting (shown while it runs: the connections open now are not known here).
    static func entry(_ info: DownloadInfo, removed: Bool = false, connections: Int, keys: Set<String>?) -> RPCValue {
        let total = info.progress.totalBytes ?? 0
        let running = info.state == .running && !removed
        let stopped = removed || info.state.isFinal
        var d: [String: RPCValue] = [
            "gid": .string(GID(UInt64(bitPattern: info.id.rawValue)).description),
            "status": .string(removed ? "removed" : word(info.state)),
            "totalLength": .string(String(total)),
            "completedLength": .string(String(info.progress.bytesDone)),
            "uploadLength": .string("0"),
            "downloadSpeed": .string(running ? String(Int64(max(0, info.progress.bytesPerSecond).rounded())) : "0"),
            "uploadSpeed": .string("0"),
            "connections": .string(running ? String(info.connections ?? connections) : "0"),
            "pieceLength": .string(String(pieceLength)),
            "numPieces": .string(String((total + pieceLength - 1) / pieceLength)),
            "dir": .string(dir(info).string),
        ]
        if stopped {
            let (code, message): (String, String) =
                if removed { (removedCode, "") }
                else if let failure = info.failure, info.state == .failed { (errorCode(failure.category), failure.reason) }
                else { ("0", "") }
            d["errorCode"] = .string(code)
            d["errorMessage"] = .string(message)
        }
        if keys == nil || keys?.contains("files") == true { d["files"] = files(info) }
        if let keys { d = d.filter { keys.contains($0.key) } }
        return .object(d)
    }

    /// `getGlobalStat`: speeds and counts.
    static func globalStat(_ totals: ManagerTotals, removed: Int) -> RPCValue {
        let stopped = totals.count(.completed) + totals.count(.failed) + removed
        return .strings([
            "downloadSpeed": String(Int64(max(0, totals.bytesPerSecond).rounded())),
            "uploadSpeed": "0",
            "numActive": String(totals.count(.running)),
            "numWaiting": String(totals.count(.waiting) + totals.count(.paused)),
            "numStopped": String(stopped),
            "numStoppedTotal": String(stopped),
        ])
    }
}

/// aria2's pagination of `tellWaiting` and `tellStopped` (`offset`, `num`): a negative offset
/// counts from the end and the answer is then in reverse order.
enum Aria2Page {
    /// Downloads in one answer at most (a larger `num` is cut to it): AriaNg and aria2p ask for 1,000.
    static let maxCount: Int64 = 1000

    /// The indices of a list of `count` items that `offset` and `num` select, in list order (the
    /// answer reverses them for a negative offset).
    static func indices(count: Int, offset: Int64, num: Int64) -> Range<Int> {
        let size = Int64(count)
        var num = min(num, maxCount)
        guard num > 0 else { return 0..<0 }
        var offset = offset
        if offset < 0 {
            // -1 is the last item; from there backwards, num of them.
            guard offset >= -size else { return 0..<0 }
            let last = offset + size
            offset = last - (num - 1)
            if offset < 0 {
                offset = 0
                num = last + 1
            }
        } else if offset >= size {
            return 0..<0
        }
        return Int(offset)..<Int(min(size, offset + num))
    }

    /// `items` paged as aria2 pages them.
    static func page<T>(_ items: [T], offset: Int64, num: Int64) -> [T] {
        let picked = indices(count: items.count, offset: offset, num: num).map { items[$0] }
        return offset < 0 ? picked.reversed() : picked
    }
}

/// aria2's options, where they mean something in Pickup; every other option is accepted and
/// ignored, as aria2 ignores the options it cannot apply in a context (AriaNg sends many).
enum Aria2Options {
    /// A size or rate in aria2's form: digits with an optional K or M (or G), 1K = 1024.
    static func bytes(_ text: String) -> Int64? {
        var digits = Substring(text)
        var unit: Int64 = 1
        switch text.last {
        case "K", "k": unit = 1 << 10
        case "M", "m": unit = 1 << 20
        case "G", "g": unit = 1 << 30
        default: break
        }
        if unit > 1 { digits = digits.dropLast() }
        guard !digits.isEmpty, digits.utf8.count <= 19, digits.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
            let n = Int64(digits)
        else { return nil }
        let (product, overflow) = n.multipliedReportingOverflow(by: unit)
        return overflow ? nil : product
    }

    /// A speed limit: 0 is none; otherwise at least ``RateLimiter/minimum``.
    static func limit(_ name: String, _ text: String) throws(Aria2Fault) -> Int64? {
        guard let n = bytes(text) else { throw Aria2Fault("\(name) must be a number of bytes per second, with K or M: not \(Aria2Fault.shown(text))") }
        if n == 0 { return nil }
        guard n >= RateLimiter.minimum else { throw Aria2Fault("\(name) must be 0 (none) or at least 1K") }
        return n
    }

    /// A string option's value (aria2 ignores an option whose value is not a string).
    static func text(_ options: [String: RPCValue], _ name: String) -> String? { options[name]?.string }

    /// What `addUri`'s (and `addMetalink`'s) options ask of a new download.
    struct Add: Equatable, Sendable {
        /// `dir`: absolute (inside the download root) or relative to it.
        var dir: String?
        /// `out`: the file's name in `dir`.
        var out: String?
        /// `split` and `max-connection-per-server` (the smaller when both): connections, 1 to 32.
        var connections: Int?
        /// `max-download-limit` (nil: none).
        var speedLimit: Int64?
        /// `header`: one `Name: value` or an array of them.
        var headers: [RequestHeader] = []
        /// `checksum`: `TYPE=HEX` (aria2's form is Pickup's `--checksum`).
        var checksum: ExpectedDigest?
        /// `pause`: add it paused.
        var paused = false

        /// The options decoded; a value Pickup cannot take is refused (aria2 refuses a bad value of
        /// an option it knows).
        init(_ options: [String: RPCValue]) throws(Aria2Fault) {
            dir = text(options, "dir").flatMap { $0.isEmpty ? nil : $0 }
            out = text(options, "out").flatMap { $0.isEmpty ? nil : $0 }
            for name in ["split", "max-connection-per-server"] {
                guard let t = text(options, name) else { continue }
                guard let n = Int(t), n >= 1 else { throw Aria2Fault("\(name) must be a whole number, 1 or more") }
                connections = min(connections ?? 32, n)
            }
            if let t = text(options, "max-download-limit") { speedLimit = try limit("max-download-limit", t) }
            let lines: [String] = switch options["header"] {
            case .string(let s)?: [s]
            case .array(let a)?: a.compactMap(\.string)
            default: []
            }
            guard lines.count <= 64 else { throw Aria2Fault("at most 64 header fields") }
            for line in lines where !line.isEmpty {
                guard let colon = line.firstIndex(of: ":") else { throw Aria2Fault("header must be 'Name: value'") }
                let value = line[line.index(after: colon)...].drop(while: { $0 == " " || $0 == "\t" })
                do throws(PickupError) {
                    headers.append(try RequestHeader(name: String(line[..<colon]), value: String(value)))
                } catch {
                    throw Aria2Fault("header: \(error.description)")
                }
            }
            if let t = text(options, "checksum"), !t.isEmpty {
                guard let c = ExpectedDigest(checksumArgument: t) else {
                    throw Aria2Fault("checksum must be TYPE=DIGEST with sha-256, sha-512, sha-1 or md5")
                }
                checksum = c
            }
            paused = text(options, "pause") == "true"
            if let proxy = text(options, "all-proxy"), !proxy.isEmpty {
                // Pickup has one proxy for every download (changeGlobalOption's all-proxy): a
                // download's own would be silently not used, and its traffic go elsewhere.
                throw Aria2Fault("all-proxy is global in Pickup: set it with aria2.changeGlobalOption")
            }
        }
    }

    /// `getOption`: the options of a download that mean something in Pickup (header values are
    /// never shown: they may carry credentials).
    static func of(_ info: DownloadInfo, connections: Int) -> RPCValue {
        var d: [String: String] = [
            "dir": Aria2Status.dir(info).string,
            "split": String(info.connections ?? connections),
            "max-connection-per-server": String(info.connections ?? connections),
            "max-download-limit": String(info.speedLimit ?? 0),
            "pause": info.state == .paused ? "true" : "false",
        ]
        if let name = Aria2Status.path(info)?.lastComponent?.string { d["out"] = name }
        if let c = info.checksum { d["checksum"] = "\(c.algorithm.rawValue)=\(c.hex)" }
        return .strings(d)
    }

    /// `getGlobalOption`.
    static func global(root: FilePath, settings: APISettings, connections: Int) -> RPCValue {
        var d: [String: String] = [
            "dir": root.string,
            "max-concurrent-downloads": String(settings.maxConcurrentDownloads),
            "max-overall-download-limit": String(settings.speedLimit ?? 0),
            "split": String(connections),
            "max-connection-per-server": String(connections),
            "continue": "true",
        ]
        if let proxy = settings.proxy { d["all-proxy"] = proxy }
        return .strings(d)
    }

    /// `changeGlobalOption`: the change of the daemon's settings it asks for (the one owner of
    /// those is ``DaemonSettings``).
    static func settingsPatch(_ options: [String: RPCValue]) throws(Aria2Fault) -> APISettingsPatch {
        var patch = APISettingsPatch()
        if let t = text(options, "max-concurrent-downloads") {
            guard let n = Int(t) else { throw Aria2Fault("max-concurrent-downloads must be a whole number") }
            patch.maxConcurrentDownloads = n
        }
        if let t = text(options, "max-overall-download-limit") {
            patch.speedLimit = .some(try limit("max-overall-download-limit", t))
        }
        if let t = text(options, "all-proxy") { patch.proxy = .some(t.isEmpty ? nil : t) }
        return patch
    }
}

/// aria2's WebSocket notifications, from the changes of a download's state.
enum Aria2Notification {
    /// The notification for a download going from `before` (nil: not known until now) to
    /// `after` (nil: removed), if any.
    static func method(from before: DownloadState?, to after: DownloadState?) -> String? {
        guard let after else {
            // Removed: aria2's onDownloadStop ("stopped by the user"), unless it had ended.
            guard let before, !before.isFinal else { return nil }
            return "aria2.onDownloadStop"
        }
        guard before != after else { return nil }
        switch after {
        case .running: return "aria2.onDownloadStart"
        case .paused: return "aria2.onDownloadPause"
        case .completed: return "aria2.onDownloadComplete"
        case .failed: return "aria2.onDownloadError"
        case .waiting: return nil
        }
    }

    /// The notification's JSON text.
    static func text(_ method: String, _ gid: GID) -> String {
        let value = RPCValue.object(["jsonrpc": .string("2.0"), "method": .string(method),
                                     "params": .array([.strings(["gid": gid.description])])])
        return String(decoding: value.json, as: UTF8.self)
    }
}

/// Which browser origins may call `/jsonrpc` (`--rpc-allow-origin`): AriaNg and extensions run
/// on other origins than the daemon's. The REST API's origin rule (``OriginGuard``) is not
/// changed by it.
struct Aria2Origins: Sendable, Equatable {
    /// Origins, normalized (`scheme://host[:port]`, lower case).
    var listed: Set<String> = []
    /// `*`: every origin (aria2's `--rpc-allow-origin-all`). The secret is still required.
    var all = false

    /// From the command line's values: `*` or `http(s)://host[:port]` (or an extension's
    /// `chrome-extension://ID`, `moz-extension://ID`).
    init(_ values: [String]) throws(PickupError) {
        for v in values {
            if v == "*" {
                all = true
                continue
            }
            guard let o = Self.normalized(v) else {
                throw .invalidInput("--rpc-allow-origin must be * or an origin such as http://localhost:6880, not \(v)")
            }
            listed.insert(o)
        }
    }

    init() {}

    /// `scheme://authority` of an origin, lower case, no trailing slash; nil when it is not one.
    static func normalized(_ text: String) -> String? {
        var t = text.lowercased()
        if t.hasSuffix("/") { t.removeLast() }
        guard let sep = t.range(of: "://") else { return nil }
        let scheme = t[..<sep.lowerBound], rest = t[sep.upperBound...]
        guard !scheme.isEmpty, scheme.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "+" || $0 == "-" || $0 == "." }),
            !rest.isEmpty, !rest.contains("/"), !rest.contains("@"), !rest.contains(where: { $0.isWhitespace })
        else { return nil }
        return t
    }

    /// What a request's `Origin` is to `/jsonrpc`.
    enum Decision: Equatable { case sameOrigin, allowed(String), refused }

    func decide(origin: String?, own: Set<String>) -> Decision {
        guard let origin else { return .sameOrigin }
        if OriginGuard<BasicRequestContext>.isOwn(origin: origin, own: own) { return .sameOrigin }
        if all || Self.normalized(origin).map(listed.contains) == true { return .allowed(origin) }
        return .refused
    }
}
