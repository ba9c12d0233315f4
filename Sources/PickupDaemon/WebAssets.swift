import Foundation
import HTTPTypes
import Hummingbird

/// The web page and the OpenAPI document, shipped as package resources and read once. Each is
/// served at a fixed route: no request path ever reaches the file system (webui-aria2's
/// CVE-2023-39141 was a path traversal in exactly this place).
enum WebAssets {
    struct Asset: Sendable {
        let bytes: ByteBuffer
        let type: String
    }

    static let files: [String: Asset] = {
        var files: [String: Asset] = [:]
        for (name, type) in [("index.html", "text/html; charset=utf-8"), ("app.js", "text/javascript; charset=utf-8"),
                             ("style.css", "text/css; charset=utf-8")] {
            if let url = Bundle.module.url(forResource: name, withExtension: nil, subdirectory: "Web"),
                let data = try? Data(contentsOf: url) {
                files[name] = Asset(bytes: ByteBuffer(bytes: data), type: type)
            }
        }
        if let url = Bundle.module.url(forResource: "openapi", withExtension: "json"), let data = try? Data(contentsOf: url) {
            files["openapi.json"] = Asset(bytes: ByteBuffer(bytes: data), type: "application/json")
        }
        return files
    }()

    /// The OpenAPI 3.1 document of the API.
    static var openAPI: Response { response("openapi.json") }

    static func register(on router: Router<BasicRequestContext>) {
        router.get("/") { _, _ in response("index.html") }
        router.get("/app.js") { _, _ in response("app.js") }
        router.get("/style.css") { _, _ in response("style.css") }
    }

    static func response(_ name: String) -> Response {
        guard let asset = files[name] else {
            return Response(status: .internalServerError, body: ResponseBody(byteBuffer: ByteBuffer(string: "\(name) is missing from the build\n")))
        }
        return Response(status: .ok, headers: [
            .contentType: asset.type,
            .cacheControl: "no-cache",
            // The page runs its own script only, and talks to nothing but this daemon.
            .contentSecurityPolicy: "default-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        ], body: ResponseBody(byteBuffer: asset.bytes))
    }
}
