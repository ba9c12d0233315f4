import Atomics
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import Pickup

/// An API error: a status, a stable code and a readable message, sent as
/// `{"error": {"code": ..., "message": ...}}`.
struct APIError: Error, HTTPResponseError {
    let status: HTTPResponse.Status
    let code: String
    let message: String

    static func badRequest(_ message: String) -> APIError { APIError(status: .badRequest, code: "bad_request", message: message) }
    static func badName(_ message: String) -> APIError { APIError(status: .badRequest, code: "bad_name", message: message) }
    static func notFound(_ message: String) -> APIError { APIError(status: .notFound, code: "not_found", message: message) }
    static func conflict(_ message: String) -> APIError { APIError(status: .conflict, code: "conflict", message: message) }

    /// The API's answer to an engine or manager error.
    init(_ error: PickupError) {
        switch error {
        case .invalidInput(let m): self.init(status: .badRequest, code: "bad_request", message: m)
        default: self.init(status: .serviceUnavailable, code: error.category.rawValue, message: error.description)
        }
    }

    init(status: HTTPResponse.Status, code: String, message: String) {
        self.status = status
        self.code = code
        self.message = message
    }

    func response(from request: Request, context: some Hummingbird.RequestContext) throws -> Response {
        var response = JSON.response(APIErrorEnvelope(error: APIErrorBody(code: code, message: message)), status: status)
        if status == .unauthorized { response.headers[.wwwAuthenticate] = "Bearer" }
        return response
    }
}

enum JSON {
    static let encoder: JSONEncoder = {
        let e = JSONEncoder()
        e.outputFormatting = [.withoutEscapingSlashes]
        return e
    }()

    static func response(_ value: some Encodable, status: HTTPResponse.Status = .ok) -> Response {
        response(bytes: (try? encoder.encode(value)) ?? Data("{}".utf8), status: status)
    }

    static func response(bytes: some Sequence<UInt8>, status: HTTPResponse.Status = .ok) -> Response {
        Response(status: status, headers: [.contentType: "application/json", .cacheControl: "no-store"],
                 body: ResponseBody(byteBuffer: ByteBuffer(bytes: bytes)))
    }

    /// Decodes a request body of at most 64 KiB, with a readable reason when it is wrong.
    static func decode<T: Decodable>(_ type: T.Type, from request: Request) async throws -> T {
        var request = request
        let body = try await request.collectBody(upTo: 64 * 1024)
        do {
            return try JSONDecoder().decode(type, from: Data(buffer: body))
        } catch let DecodingError.typeMismatch(_, ctx), let DecodingError.valueNotFound(_, ctx) {
            throw APIError.badRequest("\(field(ctx.codingPath)): wrong type")
        } catch let DecodingError.keyNotFound(key, _) {
            throw APIError.badRequest("\(key.stringValue): missing")
        } catch let DecodingError.dataCorrupted(ctx) where !ctx.codingPath.isEmpty {
            throw APIError.badRequest("\(field(ctx.codingPath)): \(ctx.debugDescription)")
        } catch {
            throw APIError.badRequest("the body is not a JSON object of the expected shape")
        }
    }

    private static func field(_ path: [any CodingKey]) -> String {
        path.map(\.stringValue).joined(separator: ".")
    }
}

extension Data {
    init(buffer: ByteBuffer) {
        self = buffer.getData(at: buffer.readerIndex, length: buffer.readableBytes) ?? Data()
    }
}

/// Turns every error into the API's JSON error (unknown routes, bodies too large, bugs), so a
/// client never sees a crash or an HTML page; adds headers every response should have.
struct ErrorMiddleware<Context: Hummingbird.RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var response: Response
        do {
            response = try await next(request, context)
        } catch let e as APIError {
            response = try e.response(from: request, context: context)
        } catch let e as any HTTPResponseError {
            let code = switch e.status.code {
            case 404: "not_found"
            case 405: "method_not_allowed"
            case 413: "payload_too_large"
            default: e.status.code < 500 ? "bad_request" : "internal"
            }
            response = try APIError(status: e.status, code: code, message: e.status.reasonPhrase).response(from: request, context: context)
        } catch {
            response = try APIError(status: .internalServerError, code: "internal", message: "internal error")
                .response(from: request, context: context)
        }
        response.headers[.xContentTypeOptions] = "nosniff"
        response.headers[HTTPField.Name("X-Frame-Options")!] = "DENY"
        response.headers[HTTPField.Name("Referrer-Policy")!] = "no-referrer"
        return response
    }
}

/// Refuses a request whose `Host` or `Origin` is not the daemon's own address: a web page in the
/// user's browser can neither drive the daemon cross-origin nor by DNS rebinding (the rebound
/// name arrives in `Host`). No CORS headers are ever sent.
struct OriginGuard<Context: Hummingbird.RequestContext>: RouterMiddleware {
    let daemon: Daemon

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        // aria2's JSON-RPC has its own origin rule (its clients run on other origins; its secret
        // goes in the body): ``Aria2Service/guarded(_:context:next:)``.
        if let rpc = daemon.aria2, request.uri.path == Aria2Service.path {
            return try await rpc.guarded(request, context: context, next: next)
        }
        let allowed = daemon.authorities.withLockedValue { $0 }
        guard Self.hostAllowed(request, own: allowed) else {
            throw APIError(status: .forbidden, code: "forbidden_host", message: "this Host is not the daemon's address")
        }
        if let origin = request.headers[.origin] {
            guard Self.isOwn(origin: origin, own: allowed) else {
                throw APIError(status: .forbidden, code: "forbidden_origin", message: "cross-origin requests are refused")
            }
        }
        return try await next(request, context)
    }

    /// Whether `origin` is the daemon's own (`http://` one of its addresses, `own`).
    static func isOwn(origin: String, own: Set<String>) -> Bool {
        let lower = origin.lowercased()
        return lower.hasPrefix("http://") && own.contains(String(lower.dropFirst("http://".count)))
    }

    /// Whether the request's `Host` is one of the daemon's own addresses (`own`).
    static func hostAllowed(_ request: Request, own: Set<String>) -> Bool {
        guard let host = request.head.authority?.lowercased() else { return false }
        return own.contains(host)
    }
}

/// Every API call carries `Authorization: Bearer <token>`, compared in constant time; otherwise
/// 401 and nothing else.
struct BearerAuth<Context: Hummingbird.RequestContext>: RouterMiddleware {
    let token: [UInt8]

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard let header = request.headers[.authorization], header.hasPrefix("Bearer "),
            ConstantTime.equal(Array(header.utf8.dropFirst("Bearer ".utf8.count)), token)
        else {
            throw APIError(status: .unauthorized, code: "unauthorized", message: "a valid bearer token is required")
        }
        return try await next(request, context)
    }
}

/// The token compared (the API's bearer token, aria2's secret).
enum ConstantTime {
    /// Equal without an early exit, so the time taken says nothing about where they differ.
    static func equal(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        var diff: UInt8 = 0
        for i in 0..<a.count { diff |= a[i] ^ b[i] }
        return diff == 0
    }
}

/// Caps the daemon's connections: one past `limit` is closed as soon as it is set up, before it
/// is read from, so that a client opening connections by the hundred cannot exhaust descriptors
/// (and with them the API, the hooks and the downloads' files). Idle connections and slow heads
/// are closed by the server's idle timeout (``DaemonConfiguration/idleTimeout``).
final class ConnectionLimit: ChannelInboundHandler, RemovableChannelHandler, Sendable {
    // A pass-through: nothing is read as a type (the parts are the server's HTTPRequestPart).
    typealias InboundIn = Any
    typealias InboundOut = Any

    let open: ManagedAtomic<Int>
    let limit: Int
    private let counted = ManagedAtomic(false)

    init(open: ManagedAtomic<Int>, limit: Int) {
        self.open = open
        self.limit = limit
    }

    func handlerAdded(context: ChannelHandlerContext) {
        counted.store(true, ordering: .relaxed)
        if open.wrappingIncrementThenLoad(ordering: .relaxed) > limit {
            context.close(promise: nil)
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        if counted.exchange(false, ordering: .relaxed) { open.wrappingDecrement(ordering: .relaxed) }
    }
}
