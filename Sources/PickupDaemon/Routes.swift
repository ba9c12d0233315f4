import Foundation
import HTTPTypes
import Hummingbird
import Pickup
import SystemPackage

/// The HTTP API under `/api/v1` and the web page at `/`.
struct Routes {
    let daemon: Daemon
    var manager: DownloadManager { daemon.manager }

    func register(on router: Router<BasicRequestContext>) {
        router.add(middleware: ErrorMiddleware())
        router.add(middleware: OriginGuard(daemon: daemon))
        WebAssets.register(on: router)
        router.get("/api/v1/openapi.json") { _, _ in WebAssets.openAPI }

        let api = router.group("/api/v1").add(middleware: BearerAuth(token: Array(daemon.token.utf8)))
        api.post("/downloads") { request, _ in try await add(request) }
        api.get("/downloads") { request, _ in try await list(request) }
        api.delete("/downloads") { request, _ in try await removeAll(request) }
        api.get("/downloads/{id}") { _, context in JSON.response(try await download(context)) }
        api.patch("/downloads/{id}") { request, context in try await change(request, context) }
        api.delete("/downloads/{id}") { request, context in
            let id = try await known(context)
            // Nothing on disk goes unless asked: the finished file with deleteFile, an unfinished
            // one's partial file (and its helpers) with deletePartial.
            let (deleteFile, deletePartial) = (try flag(request, "deleteFile"), try flag(request, "deletePartial"))
            do throws(PickupError) {
                try await manager.remove(id, deleteFile: deleteFile, deletePartial: deletePartial)
            } catch { throw APIError(error) }
            return Response(status: .noContent)
        }
        api.post("/downloads/{id}/pause") { _, context in
            try await act(context) { m, id throws(PickupError) in try await m.pause(id) }
        }
        api.post("/downloads/{id}/resume") { _, context in
            try await act(context) { m, id throws(PickupError) in try await m.resume(id) }
        }
        api.post("/downloads/{id}/retry") { _, context in
            let id = try await known(context)
            guard await manager.download(id)?.state == .failed else { throw APIError.conflict("only a failed download can be retried") }
            return try await act(context) { m, id throws(PickupError) in try await m.resume(id) }
        }
        api.post("/pause-all") { _, _ in
            await manager.pauseAll()
            return Response(status: .noContent)
        }
        api.post("/resume-all") { _, _ in
            await manager.resumeAll()
            return Response(status: .noContent)
        }
        api.get("/settings") { _, _ in JSON.response(await daemon.settings.shown()) }
        api.patch("/settings") { request, _ in
            let patch = try await JSON.decode(APISettingsPatch.self, from: request)
            return JSON.response(try await daemon.settings.apply(patch))
        }
        api.get("/events") { _, _ in try await events() }
    }

    // MARK: - Handlers

    private func add(_ request: Request) async throws -> Response {
        let body = try await JSON.decode(APIAddRequest.self, from: request)
        let destination: Destination =
            if let name = body.name { .file(try Confinement.resolve(name, in: daemon.root)) } else { .directory(daemon.root) }
        var checksum: ExpectedDigest?
        if let text = body.checksum {
            guard let c = ExpectedDigest(checksumArgument: text) else {
                throw APIError.badRequest("checksum must be ALGO=HEX with sha-256, sha-512, sha-1 or md5")
            }
            checksum = c
        }
        if let limit = body.speedLimit, limit < RateLimiter.minimum {
            throw APIError.badRequest("speedLimit must be at least \(RateLimiter.minimum) bytes per second")
        }
        if let priority = body.priority, !(-1000...1000).contains(priority) {
            throw APIError.badRequest("priority must be -1000 to 1000")
        }
        var options = RequestOptions()
        do throws(PickupError) {
            options.headers = try (body.headers ?? [:]).sorted { $0.key < $1.key }.map { k, v throws(PickupError) in try RequestHeader(name: k, value: v) }
        } catch {
            throw APIError.badRequest("headers: \(error.description)")
        }
        let item = NewDownload(url: body.url, to: destination, priority: body.priority ?? 0, checksum: checksum,
                               speedLimit: body.speedLimit, paused: body.paused ?? false, connections: body.connections,
                               options: options, mirrors: (body.urls ?? []).filter { $0 != body.url })
        let id: DownloadID
        do throws(PickupError) { id = try await manager.add([item])[0] } catch { throw APIError(error) }
        guard let info = await manager.download(id) else { throw APIError.notFound("the download was removed meanwhile") }
        return JSON.response(APIDownload(info, root: daemon.root), status: .created)
    }

    private func list(_ request: Request) async throws -> Response {
        var state: DownloadState?
        if let text = request.uri.queryParameters["state"] {
            guard let s = DownloadState(rawValue: String(text)) else {
                throw APIError.badRequest("state must be one of " + DownloadState.allCases.map(\.rawValue).joined(separator: ", "))
            }
            state = s
        }
        let offset = try number(request, "offset") ?? 0
        let limit = try number(request, "limit")
        var page = await manager.downloads(in: state, offset: offset, limit: limit)
        if let url = request.uri.queryParameters["url"] {
            // Exact match on the URL as it was added; with state, offset and limit applied to those.
            let matching = await manager.downloads(url: String(url)).filter { state == nil || $0.state == state }
            page = Array(matching.dropFirst(offset).prefix(limit ?? .max))
        }
        let root = daemon.root
        return JSON.response(bytes: APIDownload.json(page.lazy.map { APIDownload($0, root: root) }))
    }

    /// `PATCH /downloads/{id}`: priority, speed limit (null removes it), `position: "front"`.
    /// Everything is checked before anything changes.
    private func change(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        let id = try await known(context)
        let patch = try await JSON.decode(APIDownloadPatch.self, from: request)
        if let position = patch.position, position != "front" { throw APIError.badRequest("position must be \"front\"") }
        if let priority = patch.priority, !(-1000...1000).contains(priority) {
            throw APIError.badRequest("priority must be -1000 to 1000")
        }
        if case .some(.some(let limit)) = patch.speedLimit, limit < RateLimiter.minimum {
            throw APIError.badRequest("speedLimit must be at least \(RateLimiter.minimum) bytes per second, or null for none")
        }
        do throws(PickupError) {
            if let priority = patch.priority { try await manager.setPriority(id, priority) }
            if let limit = patch.speedLimit { try await manager.setSpeedLimit(id, limit) }
            if patch.position != nil { try await manager.moveToFront(id) }
        } catch {
            throw APIError(error)
        }
        return JSON.response(try await download(context))
    }

    /// `DELETE /downloads?state=completed` (or `failed`), `deleteFile=true` to delete the finished
    /// files too, `deletePartial=true` the failed ones' partial files.
    private func removeAll(_ request: Request) async throws -> Response {
        guard let text = request.uri.queryParameters["state"], let state = DownloadState(rawValue: String(text)),
            state == .completed || state == .failed
        else { throw APIError.badRequest("state must be completed or failed") }
        let (deleteFile, deletePartial) = (try flag(request, "deleteFile"), try flag(request, "deletePartial"))
        var removed = 0
        for info in await manager.downloads(in: state) {
            // Removed or changed meanwhile: not this call's to remove.
            guard await manager.download(info.id)?.state == state else { continue }
            do throws(PickupError) {
                try await manager.remove(info.id, deleteFile: deleteFile, deletePartial: deletePartial)
            } catch { throw APIError(error) }
            removed += 1
        }
        return JSON.response(APIRemoved(removed: removed))
    }

    private func download(_ context: BasicRequestContext) async throws -> APIDownload {
        let id = try await known(context)
        guard let info = await manager.download(id) else { throw APIError.notFound("no download \(id)") }
        return APIDownload(info, root: daemon.root)
    }

    private func known(_ context: BasicRequestContext) async throws -> DownloadID {
        guard let raw = context.parameters.get("id", as: Int64.self), await manager.download(DownloadID(rawValue: raw)) != nil else {
            throw APIError.notFound("no download \(context.parameters.get("id") ?? "")")
        }
        return DownloadID(rawValue: raw)
    }

    private func act(_ context: BasicRequestContext,
                     _ action: @Sendable (DownloadManager, DownloadID) async throws(PickupError) -> Void) async throws -> Response {
        let id = try await known(context)
        do throws(PickupError) { try await action(manager, id) } catch { throw APIError(error) }
        return JSON.response(try await download(context))
    }

    private func flag(_ request: Request, _ name: String) throws -> Bool {
        guard let text = request.uri.queryParameters[Substring(name)] else { return false }
        switch text {
        case "true", "1": return true
        case "false", "0": return false
        default: throw APIError.badRequest("\(name) must be true or false")
        }
    }

    private func number(_ request: Request, _ name: String) throws -> Int? {
        guard let text = request.uri.queryParameters[Substring(name)] else { return nil }
        guard let n = Int(text), n >= 0 else { throw APIError.badRequest("\(name) must be a whole number, 0 or more") }
        return n
    }

    /// Server-Sent Events: a `snapshot` first, then `added`, `changed`, `progress`, `totals`,
    /// `notice` and `removed` as they happen, until the client leaves, falls too far behind, or
    /// the daemon stops (``EventHub``).
    private func events() async throws -> Response {
        guard let (after, items, client) = daemon.hub.join() else {
            throw APIError(status: .serviceUnavailable, code: "too_many_clients",
                           message: "too many event streams are open; try again later")
        }
        let (hub, manager, root) = (daemon.hub, manager, daemon.root)
        let body = ResponseBody { writer in
            defer { hub.leave(client) }
            try await hub.serve(manager, root: root, to: &writer, after: after, items: items, client: client)
            try await writer.finish(nil)
        }
        return Response(status: .ok, headers: [.contentType: "text/event-stream", .cacheControl: "no-store"], body: body)
    }

    static func frame(_ event: ManagerEvent, root: FilePath) -> ByteBuffer {
        func data(_ name: String, _ value: some Encodable) -> ByteBuffer {
            let json = (try? JSON.encoder.encode(value)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
            return ByteBuffer(string: "event: \(name)\ndata: \(json)\n\n")
        }
        switch event {
        case .snapshot(let all, let totals):
            // Written by hand: a snapshot can hold thousands of downloads.
            var bytes = Array("event: snapshot\ndata: {\"downloads\":".utf8)
            bytes += APIDownload.json(all.lazy.map { APIDownload($0, root: root) })
            bytes += Array(",\"totals\":".utf8) + ((try? JSON.encoder.encode(APITotals(totals))).map(Array.init) ?? Array("{}".utf8))
            bytes += Array("}\n\n".utf8)
            return ByteBuffer(bytes: bytes)
        case .added(let info): return data("added", APIDownload(info, root: root))
        case .changed(let info): return data("changed", APIDownload(info, root: root))
        case .progress(let id, let p): return data("progress", APIProgress(id, p))
        case .totals(let t): return data("totals", APITotals(t))
        case .notice(let id, let message): return data("notice", APINotice(id: id.rawValue, message: message))
        case .removed(let id): return data("removed", APIRef(id: id.rawValue))
        }
    }
}
