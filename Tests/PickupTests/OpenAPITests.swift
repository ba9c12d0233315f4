import Foundation
import NIOHTTP1
import PickupDaemon
import Testing
import TestServer

@testable import Pickup

/// Checks JSON values against the subset of JSON Schema the OpenAPI document uses: `$ref`,
/// `type` (one or several), `properties`, `required`, `additionalProperties: false`, `items`,
/// `enum`, `minimum` and `maximum`.
struct SchemaChecker {
    let document: [String: Any]

    func check(_ value: Any, against schema: [String: Any], at path: String = "$") -> [String] {
        if let ref = schema["$ref"] as? String {
            let name = String(ref.split(separator: "/").last ?? "")
            guard let components = document["components"] as? [String: Any], let schemas = components["schemas"] as? [String: Any],
                let target = schemas[name] as? [String: Any]
            else { return ["\(path): unknown $ref \(ref)"] }
            return check(value, against: target, at: path)
        }
        var problems: [String] = []
        if let types = (schema["type"] as? [String]) ?? (schema["type"] as? String).map({ [$0] }) {
            guard types.contains(where: { Self.matches(value, $0) }) else { return ["\(path): \(value) is not \(types)"] }
        }
        if let allowed = schema["enum"] as? [String], let s = value as? String, !allowed.contains(s) {
            problems.append("\(path): \(s) not in \(allowed)")
        }
        if let n = (value as? NSNumber)?.doubleValue {
            if let min = (schema["minimum"] as? NSNumber)?.doubleValue, n < min { problems.append("\(path): \(n) < \(min)") }
            if let max = (schema["maximum"] as? NSNumber)?.doubleValue, n > max { problems.append("\(path): \(n) > \(max)") }
        }
        if let object = value as? [String: Any] {
            let properties = schema["properties"] as? [String: Any] ?? [:]
            for key in schema["required"] as? [String] ?? [] where object[key] == nil {
                problems.append("\(path): missing \(key)")
            }
            for (key, v) in object {
                if let p = properties[key] as? [String: Any] {
                    problems += check(v, against: p, at: "\(path).\(key)")
                } else if schema["additionalProperties"] as? Bool == false {
                    problems.append("\(path): undocumented field \(key)")
                }
            }
        }
        if let array = value as? [Any], let items = schema["items"] as? [String: Any] {
            for (i, v) in array.enumerated() { problems += check(v, against: items, at: "\(path)[\(i)]") }
        }
        return problems
    }

    static func matches(_ value: Any, _ type: String) -> Bool {
        switch type {
        case "null": return value is NSNull
        case "object": return value is [String: Any]
        case "array": return value is [Any]
        case "string": return value is String
        // (No response has a boolean, so numbers need not be told apart from them here.)
        case "boolean": return value is Bool
        case "integer": return (value as? NSNumber).map { $0.doubleValue == $0.doubleValue.rounded() } ?? false
        case "number": return value is NSNumber
        default: return false
        }
    }
}

@Suite(.timeLimit(.minutes(2))) struct OpenAPITests {
    /// The checker itself finds what it should, or the test below would prove nothing.
    @Test func theCheckerFindsMismatches() throws {
        let doc: [String: Any] = ["components": ["schemas": [
            "D": ["type": "object", "properties": ["id": ["type": "integer", "minimum": 1], "state": ["type": "string", "enum": ["a"]],
                                                   "size": ["type": ["integer", "null"]]],
                  "required": ["id"], "additionalProperties": false] as [String: Any],
        ]]]
        let c = SchemaChecker(document: doc)
        let ref: [String: Any] = ["$ref": "#/components/schemas/D"]
        #expect(c.check(["id": 1, "state": "a", "size": NSNull()], against: ref).isEmpty)
        #expect(c.check(["id": 1.5], against: ref).count == 1)
        #expect(c.check(["id": 0], against: ref).count == 1)
        #expect(c.check(["state": "a"], against: ref).count == 1)
        #expect(c.check(["id": 1, "state": "b"], against: ref).count == 1)
        #expect(c.check(["id": 1, "extra": 1], against: ref).count == 1)
        #expect(c.check(["id": 1, "size": "big"], against: ref).count == 1)
        #expect(c.check([["id": 1]], against: ["type": "array", "items": ref]).isEmpty)
    }

    /// Calls every documented operation for real (successes and errors) and checks each response
    /// status is documented for it and each body matches its schema; also every event type.
    @Test func realResponsesMatchTheDocument() async throws {
        try await DaemonFixture().run { f in
            let raw = try await f.raw(.GET, "/api/v1/openapi.json")
            #expect(raw.status == 200)
            let doc = try #require(try JSONSerialization.jsonObject(with: Data(raw.body.utf8)) as? [String: Any])
            #expect(doc["openapi"] as? String == "3.1.0")
            let paths = try #require(doc["paths"] as? [String: [String: Any]])
            let checker = SchemaChecker(document: doc)
            var exercised: Set<String> = []

            func call(_ method: HTTPMethod, _ template: String, _ path: String, body: String? = nil, token: Bool = true) async throws {
                let r = try await f.raw(method, "/api/v1" + path, token: token ? f.daemon.token : nil, body: body)
                let key = "\(method.rawValue.lowercased()) \(template)"
                exercised.insert(key)
                guard let operation = paths[template]?[method.rawValue.lowercased()] as? [String: Any],
                    let responses = operation["responses"] as? [String: Any]
                else {
                    Issue.record("\(key) is not in the document")
                    return
                }
                // Every query parameter a call uses is documented for its operation.
                let documentedParameters = Set((operation["parameters"] as? [[String: Any]] ?? []).compactMap { $0["name"] as? String })
                for item in path.split(separator: "?", maxSplits: 1).dropFirst().first?.split(separator: "&") ?? [] {
                    let name = String(item.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)[0])
                    #expect(documentedParameters.contains(name), "\(key): the query parameter \(name) is not documented")
                }
                guard let response = responses[String(r.status)] as? [String: Any] else {
                    Issue.record("\(key): status \(r.status) is not documented (\(r.body))")
                    return
                }
                guard let content = response["content"] as? [String: Any], let json = content["application/json"] as? [String: Any],
                    let schema = json["schema"] as? [String: Any]
                else {
                    #expect(r.body.isEmpty, "\(key) \(r.status): a body the document does not describe")
                    return
                }
                let value = try JSONSerialization.jsonObject(with: Data(r.body.utf8), options: [.fragmentsAllowed])
                let problems = checker.check(value, against: schema)
                #expect(problems.isEmpty, "\(key) \(r.status): \(problems)")
            }

            let body = Resource.bytes(count: 200_000)
            f.server.set("/a.bin", Resource(body: body))
            // Slow enough (100 s) never to complete during the test, however loaded the machine: 2 is
            // used to the end.
            f.server.set("/slow.bin", Resource(body: Resource.bytes(count: 2_000_000), bytesPerSecond: 20_000))
            f.server.set("/bad.bin", Resource(body: Resource.bytes(count: 1000)))
            try await call(.POST, "/downloads", "/downloads", body: #"{"url":"\#(f.server.url("/a.bin"))","connections":2}"#)
            try await call(.POST, "/downloads", "/downloads", body: #"{"url":"\#(f.server.url("/slow.bin"))","name":"s.bin","speedLimit":400000}"#)
            try await call(.POST, "/downloads", "/downloads", body: #"{"url":"\#(f.server.url("/bad.bin"))","priority":3,"checksum":"sha-256=\#(String(repeating: "0", count: 64))"}"#)
            try await call(.POST, "/downloads", "/downloads", body: #"{"url":1}"#)
            try await call(.POST, "/downloads", "/downloads", body: String(repeating: " ", count: 70_000))
            try await f.waitUntil { $0[1]?.state == "completed" && $0[3]?.state == "failed" && ($0[2]?.bytesDone ?? 0) > 0 }
            try await call(.GET, "/downloads", "/downloads")
            try await call(.GET, "/downloads", "/downloads?state=running&offset=0&limit=5")
            try await call(.GET, "/downloads", "/downloads?state=nope")
            for template in ["/downloads/{id}"] {
                try await call(.GET, template, "/downloads/1")
                try await call(.GET, template, "/downloads/3")
                try await call(.GET, template, "/downloads/404")
            }
            try await call(.GET, "/downloads", "/downloads?url=" + DaemonClient.escape(f.server.url("/a.bin")))
            try await call(.PATCH, "/downloads/{id}", "/downloads/2", body: #"{"priority":5,"speedLimit":null}"#)
            try await call(.PATCH, "/downloads/{id}", "/downloads/2", body: #"{"position":"back"}"#)
            try await call(.PATCH, "/downloads/{id}", "/downloads/404", body: #"{"priority":1}"#)
            try await call(.POST, "/downloads/{id}/pause", "/downloads/2/pause")
            try await call(.POST, "/downloads/{id}/pause", "/downloads/404/pause")
            try await call(.PATCH, "/downloads/{id}", "/downloads/2", body: #"{"position":"front","speedLimit":500000}"#)
            try await call(.POST, "/downloads/{id}/resume", "/downloads/2/resume")
            try await call(.POST, "/downloads/{id}/resume", "/downloads/404/resume")
            try await call(.POST, "/downloads/{id}/retry", "/downloads/1/retry")
            try await call(.POST, "/downloads/{id}/retry", "/downloads/3/retry")
            try await call(.POST, "/downloads/{id}/retry", "/downloads/404/retry")
            try await call(.POST, "/pause-all", "/pause-all")
            try await call(.POST, "/resume-all", "/resume-all")
            try await call(.GET, "/settings", "/settings")
            try await call(.PATCH, "/settings", "/settings", body: #"{"maxConcurrentDownloads":4,"speedLimit":null}"#)
            try await call(.PATCH, "/settings", "/settings", body: #"{"order":"lifo","startsAllAtOnce":true}"#)
            try await call(.PATCH, "/settings", "/settings", body: #"{"order":"random"}"#)
            try await call(.PATCH, "/settings", "/settings", body: #"{"maxConcurrentDownloads":"4"}"#)
            try await call(.GET, "/settings", "/settings", token: false)
            try await call(.DELETE, "/downloads/{id}", "/downloads/1?deletePartial=maybe")
            try await call(.DELETE, "/downloads/{id}", "/downloads/1?deleteFile=maybe")
            try await call(.DELETE, "/downloads/{id}", "/downloads/1?deleteFile=true")
            try await call(.DELETE, "/downloads/{id}", "/downloads/404")
            // (Download 2, running again since resume-all, is kept for the events below.)
            _ = try await f.client.pause(2)
            // So is 3, running until its retry has failed.
            try await f.waitUntil { $0[3]?.state == "failed" }
            try await call(.DELETE, "/downloads", "/downloads?state=running")
            try await call(.DELETE, "/downloads", "/downloads?state=failed&deletePartial=maybe")
            try await call(.DELETE, "/downloads", "/downloads?state=completed&deleteFile=true&deletePartial=false")

            // The event stream: each event's data against the schema its name says.
            let eventsOp = try #require(paths["/events"]?["get"] as? [String: Any])
            let eventSchemas = try #require(eventsOp["x-event-schemas"] as? [String: [String: Any]])
            var seen: Set<String> = []
            var pausedSeen = false
            _ = try await f.client.pause(2)
            _ = try await f.client.resume(2)
            for try await (event, data) in f.client.events() {
                guard let schema = eventSchemas[event] else {
                    Issue.record("undocumented event \(event)")
                    break
                }
                let problems = checker.check(try JSONSerialization.jsonObject(with: data), against: schema)
                #expect(problems.isEmpty, "event \(event): \(problems)")
                seen.insert(event)
                if event == "snapshot" { try await f.client.remove(3, deleteFile: false) }
                if event == "removed" { _ = try await f.client.pause(2) }
                if event == "changed", (try? JSONDecoder().decode(APIDownload.self, from: data))?.state == "paused" { pausedSeen = true }
                // The pause is followed by its totals: then every kind this test causes has come.
                if pausedSeen, seen.isSuperset(of: ["snapshot", "removed", "changed", "totals"]) { break }
            }
            exercised.insert("get /events")
            #expect(seen.isSuperset(of: ["snapshot", "changed", "totals", "removed"]), "\(seen)")

            // Everything documented was exercised (so nothing in the document is fiction).
            var documented: Set<String> = []
            for (path, item) in paths {
                for method in ["get", "post", "patch", "delete"] where item[method] != nil { documented.insert("\(method) \(path)") }
            }
            #expect(documented == exercised)
        }
    }
}
