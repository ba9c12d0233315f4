import Atomics
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdCore
import HummingbirdWebSocket
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Pickup
import SystemPackage

/// aria2's JSON-RPC at `/jsonrpc` (`pickup serve --aria2-rpc`): HTTP POST (and GET with a base64
/// query), WebSocket with aria2's notifications. The daemon's token is aria2's secret, required by
/// every method but `system.listMethods` and `system.listNotifications` (as aria2 does). The work
/// is the manager's and the settings' own calls; what a request means is ``Aria2Call``'s, what a
/// download looks like ``Aria2Status``'s.
///
/// Removing a download through RPC forgets it in the manager, its partial file kept, and keeps it
/// here as a download result (status `removed`) until `purgeDownloadResult` or
/// `removeDownloadResult`, as aria2 keeps its results: in memory, at most ``maxResults``.
final class Aria2Service: Sendable {
    static let path = "/jsonrpc"
    /// A request body at most (an `addMetalink` document goes base64 in it).
    static let maxBody = 2 << 20
    /// Removed downloads remembered at most (aria2's `--max-download-result` default).
    static let maxResults = 1000

    let manager: DownloadManager
    let settings: DaemonSettings
    let root: FilePath
    let secret: [UInt8]
    let origins: Aria2Origins
    /// The daemon's own `Host` values (the REST API's: ``Daemon/authorities``).
    let authorities: NIOLockedValueBox<Set<String>>
    /// The engine's connections per file (shown for downloads without their own).
    let connections: Int
    let sessionID: String
    let notifier: Aria2Notifier

    struct Removed: Sendable {
        var info: DownloadInfo
        var at: Date
    }

    /// Downloads removed through RPC, by GID, in the order they were removed.
    let removed = NIOLockedValueBox<[(gid: GID, result: Removed)]>([])

    init(manager: DownloadManager, settings: DaemonSettings, root: FilePath, token: String, origins: Aria2Origins,
         authorities: NIOLockedValueBox<Set<String>>, connections: Int, maxWebSockets: Int) {
        self.manager = manager
        self.settings = settings
        self.root = root
        secret = Array(token.utf8)
        self.origins = origins
        self.authorities = authorities
        self.connections = connections
        var rng = SystemRandomNumberGenerator()
        sessionID = (0..<20).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &rng)) }.joined()
        notifier = Aria2Notifier(maxClients: maxWebSockets)
    }

    // MARK: - Requests

    /// The answer to a request body: its HTTP status (aria2's: 400 for a method's fault or an
    /// invalid request, 500 for a parse error, 200 for a batch) and the JSON.
    func respond(to body: Data) async -> (status: HTTPResponse.Status, body: Data) {
        switch Aria2Request.parse(body) {
        case .invalid(let answer), .single(.failure(let answer)):
            return (Self.status(answer), answer.value.json)
        case .single(.success(let request)):
            let answer = Aria2Request.Answer(id: request.id, outcome: await call(request.method, request.params))
            return (Self.status(answer), answer.value.json)
        case .batch(let items):
            var answers: [RPCValue] = []
            for item in items {
                switch item {
                case .failure(let answer): answers.append(answer.value)
                case .success(let r): answers.append(Aria2Request.Answer(id: r.id, outcome: await call(r.method, r.params)).value)
                }
            }
            return (.ok, RPCValue.array(answers).json)
        }
    }

    static func status(_ answer: Aria2Request.Answer) -> HTTPResponse.Status {
        guard case .failure(let fault) = answer.outcome else { return .ok }
        switch fault.code {
        case 1, -32600: return .badRequest
        case -32601: return .notFound
        default: return .internalServerError
        }
    }

    /// One method call (`nested`: inside `system.multicall`).
    func call(_ method: String, _ params: [RPCValue], nested: Bool = false) async -> Result<RPCValue, Aria2Fault> {
        switch method {
        case "system.listMethods": return .success(.array(Aria2Call.methodNames.map(RPCValue.string)))
        case "system.listNotifications": return .success(.array(Aria2Call.notificationNames.map(RPCValue.string)))
        case "system.multicall":
            guard !nested else { return .failure(Aria2Fault("Recursive system.multicall forbidden.")) }
            return await multicall(params)
        default:
            let (token, rest) = Aria2Secret.split(params)
            guard Aria2Secret.matches(token, secret: secret) else { return .failure(.unauthorized) }
            do throws(Aria2Fault) {
                return .success(try await perform(try Aria2Call.decode(method, rest)))
            } catch {
                return .failure(error)
            }
        }
    }

    /// `system.multicall([{methodName, params}...])`: each call with its own secret; a result is
    /// `[value]`, a fault `{code, message}`.
    func multicall(_ params: [RPCValue]) async -> Result<RPCValue, Aria2Fault> {
        let calls: [RPCValue]
        do throws(Aria2Fault) { calls = try Aria2Call.Params(params).required(0, \.array) } catch { return .failure(error) }
        guard calls.count <= Aria2Request.maxCalls else { return .failure(Aria2Fault("at most \(Aria2Request.maxCalls) calls in a multicall")) }
        var results: [RPCValue] = []
        for spec in calls {
            guard let o = spec.object else {
                results.append(Aria2Fault("system.multicall expected struct.").value)
                continue
            }
            guard let name = o["methodName"]?.string else {
                results.append(Aria2Fault("Missing methodName.").value)
                continue
            }
            switch await call(name, o["params"]?.array ?? [], nested: true) {
            case .success(let r): results.append(.array([r]))
            case .failure(let f): results.append(f.value)
            }
        }
        return .success(.array(results))
    }

    // MARK: - Methods

    func perform(_ call: Aria2Call) async throws(Aria2Fault) -> RPCValue {
        switch call {
        case .addUri(let uris, let options, let position):
            let o = try Aria2Options.Add(options)
            var mirrors: [String] = []
            for u in uris.dropFirst() where u != uris[0] && !mirrors.contains(u) { mirrors.append(u) }
            let item = NewDownload(url: uris[0], to: try destination(o, name: o.out), checksum: o.checksum, speedLimit: o.speedLimit,
                                   paused: o.paused, connections: o.connections, options: RequestOptions(headers: o.headers),
                                   mirrors: mirrors)
            return .string(try await add([item], position: position)[0].description)
        case .addMetalink(let document, let options, let position):
            let o = try Aria2Options.Add(options)
            guard document.count <= Metalink.maxBytes else { throw Aria2Fault("the Metalink document is over \(Metalink.maxBytes) bytes") }
            let metalink: Metalink
            do throws(PickupError) { metalink = try Metalink.parse(Array(document)) } catch { throw Aria2Fault(error.description) }
            if let f = metalink.files.first(where: { $0.uncheckable != nil }), let why = f.uncheckable {
                throw Aria2Fault("the Metalink document's \(f.name): \(why)")
            }
            var items: [NewDownload] = []
            for e in InputList(metalink: metalink).entries {
                items.append(NewDownload(url: e.url, to: try destination(o, name: e.name ?? o.out), checksum: e.checksum ?? o.checksum,
                                         speedLimit: o.speedLimit, paused: o.paused, connections: o.connections,
                                         options: RequestOptions(headers: o.headers), mirrors: e.mirrors, pieces: e.pieces, length: e.length))
            }
            return .array(try await add(items, position: position).map { .string($0.description) })
        case .remove(let gid, _):
            let info = try await held(gid)
            guard !info.state.isFinal else { throw Aria2Fault("Active Download not found for GID#\(gid)") }
            // Nothing on disk goes: the partial file stays (adding the URL again resumes it), as
            // aria2 keeps a removed download's files.
            try await manage { m throws(PickupError) in try await m.remove(info.id) }
            remember(gid, info)
            return .string(gid.description)
        case .pause(let gid, _):
            let info = try await held(gid)
            guard info.state == .running || info.state == .waiting else { throw Aria2Fault("GID#\(gid) cannot be paused now") }
            try await manage { m throws(PickupError) in try await m.pause(info.id) }
            return .string(gid.description)
        case .pauseAll:
            await manager.pauseAll()
            return .string("OK")
        case .unpause(let gid):
            let info = try await held(gid)
            guard info.state == .paused else { throw Aria2Fault("GID#\(gid) cannot be unpaused now") }
            try await manage { m throws(PickupError) in try await m.resume(info.id) }
            return .string(gid.description)
        case .unpauseAll:
            await manager.resumeAll()
            return .string("OK")
        case .tellStatus(let gid, let keys):
            if let info = await manager.download(Self.id(gid)) { return entry(info, keys: keys) }
            if let r = result(gid) { return entry(r.info, removed: true, keys: keys) }
            throw Aria2Fault("No such download for GID#\(gid)")
        case .tellActive(let keys):
            return .array(await manager.downloads(in: .running).map { entry($0, keys: keys) })
        case .tellWaiting(let offset, let num, let keys):
            let waiting = await manager.downloads(in: .waiting) + manager.downloads(in: .paused)
            return .array(Aria2Page.page(waiting, offset: offset, num: num).map { entry($0, keys: keys) })
        case .tellStopped(let offset, let num, let keys):
            return .array(Aria2Page.page(await stopped(), offset: offset, num: num).map { entry($0.info, removed: $0.removed, keys: keys) })
        case .getFiles(let gid):
            if let info = await manager.download(Self.id(gid)) { return Aria2Status.files(info) }
            if let r = result(gid) { return Aria2Status.files(r.info) }
            throw Aria2Fault("No file data is available for GID#\(gid)")
        case .getUris(let gid):
            guard let info = await manager.download(Self.id(gid)) else { throw Aria2Fault("No URI data is available for GID#\(gid)") }
            return Aria2Status.uris(info)
        case .getPeers(let gid):
            guard await manager.download(Self.id(gid)) != nil else { throw Aria2Fault("No peer data is available for GID#\(gid)") }
            return .array([])
        case .getServers(let gid):
            guard let info = await manager.download(Self.id(gid)), info.state == .running else {
                throw Aria2Fault("No active download for GID#\(gid)")
            }
            let url = RPCValue.string(DownloadURL.redacted(info.url))
            let server = RPCValue.object(["uri": url, "currentUri": url,
                                          "downloadSpeed": .string(String(Int64(max(0, info.progress.bytesPerSecond).rounded())))])
            return .array([.object(["index": .string("1"), "servers": .array([server])])])
        case .changePosition(let gid, let pos, let how):
            let info = try await held(gid)
            guard ["POS_SET", "POS_CUR", "POS_END"].contains(how) else { throw Aria2Fault("Illegal argument.") }
            guard info.state == .waiting || info.state == .paused else { throw Aria2Fault("GID#\(gid) not found in the waiting queue.") }
            guard how == "POS_SET", pos == 0 else { throw Aria2Fault("Pickup moves a download only to the front of the queue (0, POS_SET)") }
            try await manage { m throws(PickupError) in try await m.moveToFront(info.id) }
            return .int(0)
        case .getOption(let gid):
            if let info = await manager.download(Self.id(gid)) { return Aria2Options.of(info, connections: connections) }
            if let r = result(gid) { return Aria2Options.of(r.info, connections: connections) }
            throw Aria2Fault("Cannot get option for GID#\(gid)")
        case .changeOption(let gid, let options):
            guard let info = await manager.download(Self.id(gid)) else { throw Aria2Fault("Cannot change option for GID#\(gid)") }
            if let t = Aria2Options.text(options, "max-download-limit") {
                let limit = try Aria2Options.limit("max-download-limit", t)
                try await manage { m throws(PickupError) in try await m.setSpeedLimit(info.id, limit) }
            }
            return .string("OK")
        case .getGlobalOption:
            return Aria2Options.global(root: root, settings: await settings.shown(), connections: connections)
        case .changeGlobalOption(let options):
            let patch = try Aria2Options.settingsPatch(options)
            do throws(APIError) { _ = try await settings.apply(patch) } catch { throw Aria2Fault(error.message) }
            return .string("OK")
        case .getGlobalStat:
            return Aria2Status.globalStat(await manager.totals(), removed: removed.withLockedValue { $0.count })
        case .purgeDownloadResult:
            for info in await manager.downloads(in: .completed) + manager.downloads(in: .failed) {
                // Removed or changed meanwhile: not this call's to remove. The files stay.
                guard let now = await manager.download(info.id), now.state.isFinal else { continue }
                try await manage { m throws(PickupError) in try await m.remove(info.id) }
            }
            removed.withLockedValue { $0.removeAll() }
            return .string("OK")
        case .removeDownloadResult(let gid):
            let forgotten = removed.withLockedValue { list -> Bool in
                guard let i = list.firstIndex(where: { $0.gid == gid }) else { return false }
                list.remove(at: i)
                return true
            }
            if forgotten { return .string("OK") }
            guard let info = await manager.download(Self.id(gid)), info.state.isFinal else {
                throw Aria2Fault("Could not remove download result of GID#\(gid)")
            }
            try await manage { m throws(PickupError) in try await m.remove(info.id) }
            return .string("OK")
        case .getVersion:
            // The level of aria2's RPC spoken (clients check it); the features Pickup has.
            return .object(["version": .string("1.37.0"),
                            "enabledFeatures": .array(["HTTPS", "Message Digest", "Metalink", "Pickup"].map(RPCValue.string))])
        case .getSessionInfo:
            return .strings(["sessionId": sessionID])
        case .saveSession:
            // Pickup saves every change as it happens.
            return .string("OK")
        }
    }

    static func id(_ gid: GID) -> DownloadID { DownloadID(rawValue: Int64(bitPattern: gid.bits)) }

    func entry(_ info: DownloadInfo, removed: Bool = false, keys: Set<String>?) -> RPCValue {
        Aria2Status.entry(info, removed: removed, connections: connections, keys: keys)
    }

    /// A download the manager holds.
    func held(_ gid: GID) async throws(Aria2Fault) -> DownloadInfo {
        guard let info = await manager.download(Self.id(gid)) else { throw Aria2Fault("GID \(gid) is not found") }
        return info
    }

    /// A manager call, its error as aria2's fault.
    func manage(_ body: @Sendable (DownloadManager) async throws(PickupError) -> Void) async throws(Aria2Fault) {
        do throws(PickupError) { try await body(manager) } catch { throw Aria2Fault(error.description) }
    }

    func add(_ items: [NewDownload], position: Int64?) async throws(Aria2Fault) -> [GID] {
        let ids: [DownloadID]
        do throws(PickupError) { ids = try await manager.add(items) } catch { throw Aria2Fault(error.description) }
        if position == 0 {
            // The front of the queue: the last added first, as aria2 inserts them in order at 0.
            for id in ids.reversed() { try await manage { m throws(PickupError) in try await m.moveToFront(id) } }
        }
        return ids.map { GID(UInt64(bitPattern: $0.rawValue)) }
    }

    /// Where a new download goes: `dir` (the download root, or a directory inside it) and the
    /// file's `name`, confined to the root as the REST API's names are (``Confinement``).
    func destination(_ o: Aria2Options.Add, name: String?) throws(Aria2Fault) -> Destination {
        var sub = ""
        if let dir = o.dir {
            let path = FilePath(dir).lexicallyNormalized()
            if path.isAbsolute {
                if path != root {
                    guard let inside = Confinement.relative(path, to: root) else {
                        throw Aria2Fault("dir must be the download root \(root) or a directory inside it")
                    }
                    sub = inside
                }
            } else if path.string != "." {
                sub = path.string
            }
        }
        guard let name else {
            guard sub.isEmpty else { throw Aria2Fault("a dir other than the download root needs out (the file's name)") }
            return .directory(root)
        }
        do throws(APIError) {
            return .file(try Confinement.resolve(sub.isEmpty ? name : sub + "/" + name, in: root))
        } catch {
            throw Aria2Fault(error.message)
        }
    }

    // MARK: - Download results

    func remember(_ gid: GID, _ info: DownloadInfo) {
        removed.withLockedValue { list in
            list.removeAll { $0.gid == gid }
            list.append((gid, Removed(info: info, at: Date())))
            if list.count > Self.maxResults { list.removeFirst(list.count - Self.maxResults) }
        }
    }

    func result(_ gid: GID) -> Removed? {
        removed.withLockedValue { list in list.first { $0.gid == gid }?.result }
    }

    /// Stopped downloads, the least recently stopped first: completed and failed ones (the
    /// manager's) and those removed through RPC.
    func stopped() async -> [(info: DownloadInfo, removed: Bool)] {
        let done = await manager.downloads(in: .completed) + manager.downloads(in: .failed)
        var all = done.map { (at: $0.finishedAt ?? $0.addedAt, info: $0, removed: false) }
        all += removed.withLockedValue { $0 }.map { (at: $0.result.at, info: $0.result.info, removed: true) }
        all.sort { ($0.at, $0.info.id) < ($1.at, $1.info.id) }
        return all.map { ($0.info, $0.removed) }
    }

    // MARK: - HTTP

    /// `/jsonrpc`'s routes: POST, GET (`method`, `id`, base64 `params`), and CORS preflight
    /// (answered by ``guarded(_:context:next:)``).
    func register(on router: Router<BasicRequestContext>) {
        router.post(RouterPath(Self.path)) { request, _ in
            var request = request
            let body = try await request.collectBody(upTo: Self.maxBody)
            return Self.response(await self.respond(to: Data(buffer: body)))
        }
        // Answered by the origin rule before it gets here (a preflight of an origin not listed is refused).
        router.on(RouterPath(Self.path), method: .options) { _, _ in Response(status: .forbidden) }
        router.get(RouterPath(Self.path)) { request, _ in
            let q = request.uri.queryParameters
            guard q["jsoncallback"] == nil else {
                throw APIError.badRequest("JSONP (jsoncallback) is not supported: use POST or a WebSocket")
            }
            guard let body = Aria2Request.fromQuery(method: q["method"].map(String.init), id: q["id"].map(String.init),
                                                    params: q["params"].map(String.init)),
                body.count <= Self.maxBody
            else {
                let answer = Aria2Request.Answer(id: .null, outcome: .failure(.parseError))
                return Self.response((Self.status(answer), answer.value.json))
            }
            return Self.response(await self.respond(to: body))
        }
    }

    static func response(_ answer: (status: HTTPResponse.Status, body: Data)) -> Response {
        Response(status: answer.status, headers: [.contentType: "application/json-rpc", .cacheControl: "no-store"],
                 body: ResponseBody(byteBuffer: ByteBuffer(bytes: answer.body)))
    }

    /// `/jsonrpc`'s origin rule, in place of the REST API's: the daemon's own `Host` only (as
    /// there: DNS rebinding), and an `Origin` that is the daemon's own or listed
    /// (`--rpc-allow-origin`); a listed one gets CORS headers, and its preflight an answer.
    func guarded<Context: Hummingbird.RequestContext>(_ request: Request, context: Context,
                                          next: (Request, Context) async throws -> Response) async throws -> Response {
        let own = authorities.withLockedValue { $0 }
        guard OriginGuard<Context>.hostAllowed(request, own: own) else {
            throw APIError(status: .forbidden, code: "forbidden_host", message: "this Host is not the daemon's address")
        }
        let decision = origins.decide(origin: request.headers[.origin], own: own)
        if request.method == .options {
            guard case .allowed(let origin) = decision, request.headers[.accessControlRequestMethod] != nil else {
                throw APIError(status: .forbidden, code: "forbidden_origin", message: "this origin may not call /jsonrpc")
            }
            var headers: HTTPFields = [.accessControlAllowOrigin: origin, .accessControlAllowMethods: "POST, GET, OPTIONS",
                                       .accessControlMaxAge: "1728000", .vary: "Origin"]
            if let asked = request.headers[.accessControlRequestHeaders] { headers[.accessControlAllowHeaders] = asked }
            return Response(status: .ok, headers: headers)
        }
        switch decision {
        case .refused:
            throw APIError(status: .forbidden, code: "forbidden_origin", message: "this origin may not call /jsonrpc")
        case .sameOrigin:
            return try await next(request, context)
        case .allowed(let origin):
            var response = try await next(request, context)
            response.headers[.accessControlAllowOrigin] = origin
            response.headers[.vary] = "Origin"
            return response
        }
    }

    /// Whether a WebSocket upgrade request may open (the same rule; browsers send `Origin`).
    func mayUpgrade(_ request: Request) -> Bool {
        let own = authorities.withLockedValue { $0 }
        guard OriginGuard<BasicRequestContext>.hostAllowed(request, own: own) else { return false }
        return origins.decide(origin: request.headers[.origin], own: own) != .refused
    }

    // MARK: - WebSocket

    /// The WebSocket router: `/jsonrpc`, requests answered in order, notifications between them.
    func webSocketRouter() -> Router<BasicWebSocketRequestContext> {
        let router = Router(context: BasicWebSocketRequestContext.self)
        router.ws(RouterPath(Self.path), shouldUpgrade: { request, _ in
            self.mayUpgrade(request) ? .upgrade([:]) : .dontUpgrade
        }, onUpgrade: { inbound, outbound, _ in
            try await self.serve(inbound, outbound)
        })
        return router
    }

    /// One WebSocket client: its answers and the notifications go out through one queue, written
    /// by one task (a message is never cut by another); a client that lets the queue fill is cut
    /// off, and every client's queue ends when the manager shuts down.
    func serve(_ inbound: WebSocketInboundStream, _ outbound: WebSocketOutboundWriter) async throws {
        guard let (queue, client) = notifier.join() else {
            try await outbound.close(.unknown(1013), reason: "too many WebSocket clients")
            return
        }
        defer { notifier.leave(client) }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                for await text in queue { try await outbound.writeTextMessage(text) }
            }
            group.addTask {
                for try await message in inbound.messages(maxSize: Self.maxBody) {
                    guard case .text(let text) = message else { continue }
                    let answer = await self.respond(to: Data(text.utf8))
                    guard self.notifier.send(String(decoding: answer.body, as: UTF8.self), to: client) else { return }
                }
            }
            _ = try await group.next()
            group.cancelAll()
        }
    }
}

/// aria2's notifications to the WebSocket clients: one subscription to the manager's events, the
/// states it has seen, and a bounded queue per client.
final class Aria2Notifier: Sendable {
    typealias Client = Int
    struct State {
        var clients: [Client: AsyncStream<String>.Continuation] = [:]
        var next = 0
        var closed = false
    }

    let maxClients: Int
    /// Messages queued for one client at most; one more cuts it off.
    let maxQueued = 256
    let state = NIOLockedValueBox(State())

    init(maxClients: Int) { self.maxClients = maxClients }

    /// Follows the manager until it shuts down; then every client's queue ends.
    func start(_ manager: DownloadManager) async {
        let events = await manager.events()
        Task {
            var states: [DownloadID: DownloadState] = [:]
            for await event in events {
                switch event {
                case .snapshot(let all, _):
                    for info in all { states[info.id] = info.state }
                case .added(let info):
                    states[info.id] = info.state
                case .changed(let info):
                    let before = states.updateValue(info.state, forKey: info.id)
                    if let method = Aria2Notification.method(from: before, to: info.state) { broadcast(method, info.id) }
                case .removed(let id):
                    let before = states.removeValue(forKey: id)
                    if let method = Aria2Notification.method(from: before, to: nil) { broadcast(method, id) }
                default:
                    break
                }
            }
            let all = state.withLockedValue { s -> [AsyncStream<String>.Continuation] in
                s.closed = true
                defer { s.clients = [:] }
                return Array(s.clients.values)
            }
            for c in all { c.finish() }
        }
    }

    func broadcast(_ method: String, _ id: DownloadID) {
        let text = Aria2Notification.text(method, GID(UInt64(bitPattern: id.rawValue)))
        for client in state.withLockedValue({ Array($0.clients.keys) }) { _ = send(text, to: client) }
    }

    /// Queues `text` for `client`; false (and the client's queue ended) when it is full or gone.
    @discardableResult
    func send(_ text: String, to client: Client) -> Bool {
        guard let c = state.withLockedValue({ $0.clients[client] }) else { return false }
        if case .enqueued = c.yield(text) { return true }
        leave(client)
        c.finish()
        return false
    }

    /// A new client's queue, or nil when `maxClients` are connected or the daemon is stopping.
    func join() -> (AsyncStream<String>, Client)? {
        let (stream, continuation) = AsyncStream<String>.makeStream(bufferingPolicy: .bufferingOldest(maxQueued))
        let key = state.withLockedValue { s -> Client? in
            guard !s.closed, s.clients.count < maxClients else { return nil }
            defer { s.next += 1 }
            s.clients[s.next] = continuation
            return s.next
        }
        guard let key else { return nil }
        return (stream, key)
    }

    func leave(_ client: Client) {
        let c = state.withLockedValue { $0.clients.removeValue(forKey: client) }
        c?.finish()
    }
}

/// The server's connections with the WebSocket upgrade (`--aria2-rpc`): HummingbirdWebSocket adds
/// its HTTP handlers only once a request head has come, so the connection limit and a deadline
/// for that first head are set here, at accept, as the plain HTTP server has them
/// (``ConnectionLimit``; later heads: the HTTP handlers' idle timeout).
struct GuardedChildChannel<Inner: ServerChildChannel>: ServerChildChannel {
    typealias Value = Inner.Value
    let inner: Inner
    let open: ManagedAtomic<Int>
    let limit: Int
    let firstHead: TimeAmount

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        do {
            try channel.pipeline.syncOperations.addHandlers([ConnectionLimit(open: open, limit: limit), FirstHeadDeadline(firstHead)],
                                                            position: .first)
        } catch {
            return channel.eventLoop.makeFailedFuture(error)
        }
        return inner.setup(channel: channel, logger: logger)
    }

    func handle(value: Value, logger: Logger) async {
        // A connection closed before its first head (by the deadline or the limit) fails the
        // upgrade's negotiation, which HummingbirdWebSocket logs as an error: one line per idle
        // connection, as many as a client opens. The plain server says nothing then.
        var quiet = logger
        quiet.logLevel = .critical
        await inner.handle(value: value, logger: quiet)
    }
}

/// Closes a connection whose first request head has not ended (an empty line) within its time;
/// then leaves the pipeline.
final class FirstHeadDeadline: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    let time: TimeAmount
    private var timer: Scheduled<Void>?
    /// The last bytes seen, to find `\r\n\r\n` across reads.
    private var tail: [UInt8] = []
    private var done = false

    init(_ time: TimeAmount) { self.time = time }

    func handlerAdded(context: ChannelHandlerContext) {
        let loop = context.eventLoop.assumeIsolated()
        let ctx = NIOLoopBound(context, eventLoop: context.eventLoop)
        timer = loop.scheduleTask(in: time) { ctx.value.close(promise: nil) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if !done {
            tail += unwrapInboundIn(data).readableBytesView
            if Self.containsEnd(tail) {
                done = true
                timer?.cancel()
                context.fireChannelRead(data)
                context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
                return
            }
            tail = Array(tail.suffix(3))
        }
        context.fireChannelRead(data)
    }

    static func containsEnd(_ bytes: [UInt8]) -> Bool {
        guard bytes.count >= 4 else { return false }
        for i in 0...(bytes.count - 4) where bytes[i] == 13 && bytes[i + 1] == 10 && bytes[i + 2] == 13 && bytes[i + 3] == 10 {
            return true
        }
        return false
    }
}
