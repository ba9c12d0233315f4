import Foundation
@testable import PickupDaemon
import SystemPackage
import Testing

@testable import Pickup

/// aria2's JSON-RPC as pure values: parsing, decoding, the mapping of downloads and options, the
/// pagination, the notifications and the origin rule, without a server.
@Suite struct Aria2RPCTests {
    func parse(_ text: String) -> Aria2Request.Body { Aria2Request.parse(Data(text.utf8)) }

    func fault(_ body: Aria2Request.Body) -> (id: RPCValue, fault: Aria2Fault)? {
        switch body {
        case .invalid(let a), .single(.failure(let a)):
            if case .failure(let f) = a.outcome { return (a.id, f) }
            return nil
        default: return nil
        }
    }

    @Test func requestsAreParsedAsAria2DoesAndBadOnesAnsweredWithJSONRPCErrors() throws {
        guard case .single(.success(let r)) = parse(#"{"jsonrpc":"2.0","id":"q","method":"aria2.tellActive","params":["token:s",["gid"]]}"#)
        else { Issue.record("not a request"); return }
        #expect(r == Aria2Request(id: .string("q"), method: "aria2.tellActive", params: [.string("token:s"), .array([.string("gid")])]))
        #expect(fault(parse("{nope"))?.id == .null)
        #expect(fault(parse("{nope"))?.fault.code == -32700)
        #expect(fault(parse(#"{"method":"aria2.getVersion"}"#))?.fault == .invalidRequest)
        #expect(fault(parse(#"{"id":7,"method":3}"#))?.id == .int(7))
        #expect(fault(parse(#"{"id":7,"method":3}"#))?.fault == .invalidRequest)
        #expect(fault(parse(#"{"id":1,"method":"aria2.getVersion","params":{"a":1}}"#))?.fault == .invalidParams)
        #expect(fault(parse("42"))?.fault == .invalidRequest)
        // A batch skips what is not an object, and is bounded.
        guard case .batch(let items) = parse(#"[{"id":1,"method":"a"}, 5, "x", {"method":"b"}]"#) else { Issue.record("not a batch"); return }
        #expect(items.count == 2)
        let many = "[" + Array(repeating: #"{"id":1,"method":"a"}"#, count: Aria2Request.maxCalls + 1).joined(separator: ",") + "]"
        #expect(fault(parse(many))?.fault.code == 1)
        // Nesting far deeper than any request: an error, not a crash.
        #expect(fault(parse(String(repeating: "[", count: 100_000)))?.fault.code == -32700)
        // Answers keep the id and carry aria2's error object.
        let answer = Aria2Request.Answer(id: .string("x"), outcome: .failure(.unauthorized))
        #expect(String(decoding: answer.value.json, as: UTF8.self)
            == #"{"error":{"code":1,"message":"Unauthorized"},"id":"x","jsonrpc":"2.0"}"#)
    }

    @Test func arbitraryBytesNeverTrapTheParser() {
        var rng = SplitMix(state: propertySeed("PICKUP_ARIA2_SEED", "arbitraryBytesNeverTrapTheParser"))
        let pieces = ["{", "}", "[", "]", "\"id\"", ":", ",", "\"method\"", "\"params\"", "1", "-1", "1e999", "true", "null",
                      "\"aria2.addUri\"", "\"token:x\"", "\\u0000", "\"", " ", "9223372036854775808"]
        for _ in 0..<5000 {
            var text = ""
            for _ in 0..<Int.random(in: 0..<40, using: &rng) { text += pieces.randomElement(using: &rng)! }
            switch Aria2Request.parse(Data(text.utf8)) {
            case .single(.success(let r)):
                _ = try? Aria2Call.decode(r.method, Aria2Secret.split(r.params).rest)
            default: break
            }
        }
    }

    @Test func theSecretIsTakenOffTheParamsAndComparedWhole() {
        let (token, rest) = Aria2Secret.split([.string("token:abc"), .string("x")])
        #expect(token == "abc")
        #expect(rest == [.string("x")])
        #expect(Aria2Secret.split([.string("abc")]).token == nil)
        #expect(Aria2Secret.split([]).token == nil)
        #expect(Aria2Secret.matches("abc", secret: Array("abc".utf8)))
        #expect(!Aria2Secret.matches("ab", secret: Array("abc".utf8)))
        #expect(!Aria2Secret.matches(nil, secret: Array("abc".utf8)))
        #expect(!Aria2Secret.matches("", secret: Array("abc".utf8)))
    }

    @Test func methodsDecodeTheirParamsAndRefuseWrongOnesAsAria2Does() throws {
        let gid = "00000000000000ff"
        #expect(try Aria2Call.decode("aria2.addUri", [.array([.string("http://a/x"), .int(3)]), .object(["out": .string("x")]), .int(0)])
            == .addUri(uris: ["http://a/x"], options: ["out": .string("x")], position: 0))
        #expect(try Aria2Call.decode("aria2.tellStatus", [.string(gid), .array([.string("gid"), .int(1)])])
            == .tellStatus(GID(255), keys: ["gid"]))
        #expect(try Aria2Call.decode("aria2.tellStatus", [.string(gid), .array([])]) == .tellStatus(GID(255), keys: nil))
        #expect(try Aria2Call.decode("aria2.tellWaiting", [.int(-1), .int(2)]) == .tellWaiting(offset: -1, num: 2, keys: nil))
        #expect(try Aria2Call.decode("aria2.forceRemove", [.string(gid)]) == .remove(GID(255), force: true))
        #expect(throws: Aria2Fault.missing(0)) { try Aria2Call.decode("aria2.remove", []) }
        #expect(throws: Aria2Fault.wrongType(0)) { try Aria2Call.decode("aria2.remove", [.int(1)]) }
        #expect(throws: Aria2Fault("Invalid GID xyz")) { try Aria2Call.decode("aria2.pause", [.string("xyz")]) }
        #expect(throws: Aria2Fault("URI is not provided.")) { try Aria2Call.decode("aria2.addUri", [.array([.int(1)])]) }
        #expect(throws: Aria2Fault.wrongType(1)) { try Aria2Call.decode("aria2.tellWaiting", [.int(0), .double(1.5)]) }
        #expect((try? Aria2Call.decode("aria2.tellStopped", [.int(0), .int(-1)])) == nil)
        #expect(throws: Aria2Fault("Position must be greater than or equal to 0.")) {
            try Aria2Call.decode("aria2.addUri", [.array([.string("http://a/x")]), .object([:]), .int(-1)])
        }
        // An unknown method's name comes back cut short.
        #expect(throws: Aria2Fault.noSuchMethod("aria2.nope")) { try Aria2Call.decode("aria2.nope", []) }
        let long = String(repeating: "m", count: 10_000)
        do {
            _ = try Aria2Call.decode(long, [])
        } catch {
            #expect(error.message.count < 100)
        }
        #expect(try Aria2Call.decode("aria2.addMetalink", [.string(Data("<x/>".utf8).base64EncodedString())])
            == .addMetalink(document: Data("<x/>".utf8), options: [:], position: nil))
    }

    @Test func aGIDIsTheDownloadIDAs16HexDigits() {
        #expect(GID(1).description == "0000000000000001")
        #expect(GID(UInt64(bitPattern: Int64(0x2089b05ecca3d829))).description == "2089b05ecca3d829")
        #expect(GID(hex: "2089B05ECCA3D829")?.description == "2089b05ecca3d829")
        #expect(GID(hex: "2089b05ecca3d82") == nil)
        #expect(GID(hex: "+089b05ecca3d829") == nil)
        #expect(GID(hex: "2089b05ecca3d8299") == nil)
        #expect(GID(hex: "ｆ089b05ecca3d829") == nil)
        #expect(Aria2Service.id(GID(hex: "00000000000000ff")!) == DownloadID(rawValue: 255))
    }

    @Test func pagesAreAria2s() {
        let abc = ["A", "B", "C"]
        #expect(Aria2Page.page(abc, offset: 0, num: 1) == ["A"])
        #expect(Aria2Page.page(abc, offset: 1, num: 2) == ["B", "C"])
        #expect(Aria2Page.page(abc, offset: -1, num: 2) == ["C", "B"])
        #expect(Aria2Page.page(abc, offset: -1, num: 10) == ["C", "B", "A"])
        #expect(Aria2Page.page(abc, offset: -3, num: 5) == ["A"])
        #expect(Aria2Page.page(abc, offset: -4, num: 1).isEmpty)
        #expect(Aria2Page.page(abc, offset: 3, num: 1).isEmpty)
        #expect(Aria2Page.page(abc, offset: 0, num: 0).isEmpty)
        #expect(Aria2Page.page(abc, offset: .min, num: .max).isEmpty)
        #expect(Aria2Page.page(abc, offset: .max, num: .max).isEmpty)
        #expect(Aria2Page.page(abc, offset: 2, num: .max) == ["C"])
        let many = Array(0..<5000)
        #expect(Aria2Page.page(many, offset: 0, num: 100_000).count == Int(Aria2Page.maxCount))
        #expect(Aria2Page.page(many, offset: -1, num: 100_000).first == 4999)
    }

    func info(_ state: DownloadState, url: String = "https://user:secret@example.com/f.iso", path: String? = "/d/sub/f.iso",
              failure: DownloadFailure? = nil) -> DownloadInfo {
        var i = DownloadInfo(id: DownloadID(rawValue: 42), url: url, destination: .directory(FilePath("/d")), state: state, priority: 0,
                             progress: DownloadProgress(bytesDone: 1500, totalBytes: 3_000_000, bytesPerSecond: 1234.4),
                             path: path.map { FilePath($0) }, failure: failure, speedLimit: nil, checksum: nil, overwrite: false,
                             connections: nil, addedAt: Date(), finishedAt: nil)
        i.mirrors = ["http://u:p@mirror.example/f.iso"]
        return i
    }

    @Test func aDownloadIsShownWithAria2sFieldsNumbersAsStringsAndNoCredentials() throws {
        let e = try #require(Aria2Status.entry(info(.running), connections: 4, keys: nil).object)
        #expect(e["gid"] == .string("000000000000002a"))
        #expect(e["status"] == .string("active"))
        #expect(e["totalLength"] == .string("3000000"))
        #expect(e["completedLength"] == .string("1500"))
        #expect(e["downloadSpeed"] == .string("1234"))
        #expect(e["uploadSpeed"] == .string("0"))
        #expect(e["connections"] == .string("4"))
        #expect(e["numPieces"] == .string("3"))
        #expect(e["dir"] == .string("/d/sub"))
        #expect(e["errorCode"] == nil)
        let file = try #require(e["files"]?.array?.first?.object)
        #expect(file["index"] == .string("1"))
        #expect(file["path"] == .string("/d/sub/f.iso"))
        #expect(file["length"] == .string("3000000"))
        #expect(file["selected"] == .string("true"))
        let text = String(decoding: RPCValue.object(e).json, as: UTF8.self)
        #expect(!text.contains("secret") && !text.contains("u:p@"), "credentials in \(text)")
        #expect(file["uris"]?.array?.first?.object?["status"] == .string("used"))
        // Every value but the files is a string.
        for (k, v) in e where k != "files" { #expect(v.string != nil, "\(k)") }

        #expect(Aria2Status.entry(info(.paused), connections: 4, keys: ["gid", "status"])
            == .object(["gid": .string("000000000000002a"), "status": .string("paused")]))
        #expect(Aria2Status.entry(info(.paused), connections: 4, keys: ["connections", "downloadSpeed"])
            == .object(["connections": .string("0"), "downloadSpeed": .string("0")]))
        let failed = Aria2Status.entry(info(.failed, failure: DownloadFailure(category: .verification, reason: "bad hash")), connections: 4,
                                       keys: ["status", "errorCode", "errorMessage"])
        #expect(failed == .object(["status": .string("error"), "errorCode": .string("32"), "errorMessage": .string("bad hash")]))
        #expect(Aria2Status.entry(info(.completed), connections: 1, keys: ["status", "errorCode"])
            == .object(["status": .string("complete"), "errorCode": .string("0")]))
        #expect(Aria2Status.entry(info(.running), removed: true, connections: 1, keys: ["status", "errorCode"])
            == .object(["status": .string("removed"), "errorCode": .string(Aria2Status.removedCode)]))
        // Before the server has named the file: no path yet, the directory asked for.
        let unnamed = try #require(Aria2Status.entry(info(.waiting, path: nil), connections: 1, keys: nil).object)
        #expect(unnamed["dir"] == .string("/d"))
        #expect(unnamed["files"]?.array?.first?.object?["path"] == .string(""))
    }

    @Test func theGlobalStatCountsAsAria2Does() {
        var t = ManagerTotals()
        t.counts = [.running: 2, .waiting: 1, .paused: 3, .completed: 4, .failed: 1]
        t.bytesPerSecond = 10.6
        #expect(Aria2Status.globalStat(t, removed: 2) == .strings([
            "downloadSpeed": "11", "uploadSpeed": "0", "numActive": "2", "numWaiting": "4", "numStopped": "7", "numStoppedTotal": "7",
        ]))
    }

    @Test func optionsInAria2sFormMapOntoPickupsAndTheRestAreIgnored() throws {
        #expect(Aria2Options.bytes("0") == 0)
        #expect(Aria2Options.bytes("1K") == 1024)
        #expect(Aria2Options.bytes("1M") == 1 << 20)
        #expect(Aria2Options.bytes("2g") == 2 << 30)
        #expect(Aria2Options.bytes("12345") == 12345)
        for bad in ["", "K", "1.5M", "-1", " 1", "1KB", "99999999999999999999", "9999999999999999G"] {
            #expect(Aria2Options.bytes(bad) == nil, "\(bad)")
        }
        let o = try Aria2Options.Add([
            "dir": .string("/d"), "out": .string("x.iso"), "split": .string("64"), "max-connection-per-server": .string("4"),
            "max-download-limit": .string("1M"), "header": .array([.string("X-A: 1"), .string("Cookie: a=b")]),
            "checksum": .string("sha-256=" + String(repeating: "ab", count: 32)), "pause": .string("true"),
            "bt-max-peers": .string("55"), "user-agent": .int(3),
        ])
        #expect(o.dir == "/d")
        #expect(o.out == "x.iso")
        #expect(o.connections == 4)
        #expect(o.speedLimit == 1 << 20)
        #expect(o.headers.map(\.name) == ["X-A", "Cookie"])
        #expect(o.headers.map(\.value) == ["1", "a=b"])
        #expect(o.checksum?.algorithm == .sha256)
        #expect(o.paused)
        #expect(try Aria2Options.Add(["split": .string("64")]).connections == 32)
        #expect(try Aria2Options.Add(["max-download-limit": .string("0")]).speedLimit == nil)
        #expect(try Aria2Options.Add(["header": .string("X-B: 2")]).headers.map(\.name) == ["X-B"])
        #expect(throws: Aria2Fault.self) { try Aria2Options.Add(["max-download-limit": .string("100")]) }
        #expect(throws: Aria2Fault.self) { try Aria2Options.Add(["max-download-limit": .string("fast")]) }
        #expect(throws: Aria2Fault.self) { try Aria2Options.Add(["split": .string("0")]) }
        #expect(throws: Aria2Fault.self) { try Aria2Options.Add(["header": .string("no colon")]) }
        #expect(throws: Aria2Fault.self) { try Aria2Options.Add(["header": .string("Bad\nName: x")]) }
        #expect(throws: Aria2Fault.self) { try Aria2Options.Add(["checksum": .string("sha-256=zz")]) }
        #expect(throws: Aria2Fault.self) { try Aria2Options.Add(["all-proxy": .string("http://proxy:3128")]) }
        #expect(try Aria2Options.Add(["all-proxy": .string("")]).dir == nil)

        let patch = try Aria2Options.settingsPatch(["max-concurrent-downloads": .string("5"), "max-overall-download-limit": .string("0"),
                                                     "all-proxy": .string(""), "log": .string("/tmp/x")])
        #expect(patch.maxConcurrentDownloads == 5)
        #expect(patch.speedLimit == .some(nil))
        #expect(patch.proxy == .some(nil))
        #expect(try Aria2Options.settingsPatch(["max-overall-download-limit": .string("2M")]).speedLimit == .some(2 << 20))
        #expect(try Aria2Options.settingsPatch([:]).speedLimit == nil)
        #expect(throws: Aria2Fault.self) { try Aria2Options.settingsPatch(["max-concurrent-downloads": .string("many")]) }

        var i = info(.paused)
        i.speedLimit = 65536
        i.checksum = ExpectedDigest(checksumArgument: "md5=" + String(repeating: "0", count: 32))
        i.options.headers = [try RequestHeader(name: "Authorization", value: "Bearer hush")]
        let shown = try #require(Aria2Options.of(i, connections: 8).object)
        #expect(shown["max-download-limit"] == .string("65536"))
        #expect(shown["split"] == .string("8"))
        #expect(shown["out"] == .string("f.iso"))
        #expect(shown["pause"] == .string("true"))
        #expect(shown["checksum"] == .string("md5=" + String(repeating: "0", count: 32)))
        #expect(!String(decoding: RPCValue.object(shown).json, as: UTF8.self).contains("hush"))
    }

    @Test func notificationsFollowStateChangesAsAria2Sends() {
        #expect(Aria2Notification.method(from: .waiting, to: .running) == "aria2.onDownloadStart")
        #expect(Aria2Notification.method(from: .running, to: .paused) == "aria2.onDownloadPause")
        #expect(Aria2Notification.method(from: .waiting, to: .paused) == "aria2.onDownloadPause")
        #expect(Aria2Notification.method(from: .running, to: .completed) == "aria2.onDownloadComplete")
        #expect(Aria2Notification.method(from: .running, to: .failed) == "aria2.onDownloadError")
        #expect(Aria2Notification.method(from: .running, to: nil) == "aria2.onDownloadStop")
        #expect(Aria2Notification.method(from: .paused, to: nil) == "aria2.onDownloadStop")
        #expect(Aria2Notification.method(from: .completed, to: nil) == nil)
        #expect(Aria2Notification.method(from: nil, to: nil) == nil)
        #expect(Aria2Notification.method(from: .paused, to: .waiting) == nil)
        #expect(Aria2Notification.method(from: .running, to: .running) == nil)
        #expect(Aria2Notification.text("aria2.onDownloadComplete", GID(2))
            == #"{"jsonrpc":"2.0","method":"aria2.onDownloadComplete","params":[{"gid":"0000000000000002"}]}"#)
    }

    @Test func onlyListedOriginsMayCallAndTheDaemonsOwnAlways() throws {
        let own: Set<String> = ["127.0.0.1:6880", "localhost:6880"]
        let none = Aria2Origins()
        #expect(none.decide(origin: nil, own: own) == .sameOrigin)
        #expect(none.decide(origin: "http://127.0.0.1:6880", own: own) == .sameOrigin)
        #expect(none.decide(origin: "http://ariang.example", own: own) == .refused)
        #expect(none.decide(origin: "null", own: own) == .refused)
        let listed = try Aria2Origins(["http://AriaNg.example/", "chrome-extension://abcdef"])
        #expect(listed.decide(origin: "http://ariang.example", own: own) == .allowed("http://ariang.example"))
        #expect(listed.decide(origin: "chrome-extension://abcdef", own: own) == .allowed("chrome-extension://abcdef"))
        #expect(listed.decide(origin: "http://ariang.example:8080", own: own) == .refused)
        #expect(listed.decide(origin: "https://ariang.example", own: own) == .refused)
        let all = try Aria2Origins(["*"])
        #expect(all.decide(origin: "http://anything.example", own: own) == .allowed("http://anything.example"))
        for bad in ["ariang.example", "http://a.example/path", "http://u@a.example", "http://", "://x", "http://a b"] {
            #expect(throws: PickupError.self) { try Aria2Origins([bad]) }
        }
    }

    @Test func theFirstHeadEndsAtAnEmptyLine() {
        #expect(FirstHeadDeadline.containsEnd(Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8)))
        #expect(!FirstHeadDeadline.containsEnd(Array("GET / HTTP/1.1\r\nHost: x\r\n".utf8)))
        #expect(!FirstHeadDeadline.containsEnd(Array("\r\n\r".utf8)))
    }

    @Test func aGetQueryStandsForTheBodyItEncodes() throws {
        let params = Data(#"["token:s","0000000000000001"]"#.utf8).base64EncodedString()
        let body = try #require(Aria2Request.fromQuery(method: "aria2.tellStatus", id: "foo", params: params))
        guard case .single(.success(let r)) = Aria2Request.parse(body) else { Issue.record("not a request"); return }
        #expect(r == Aria2Request(id: .string("foo"), method: "aria2.tellStatus",
                                  params: [.string("token:s"), .string("0000000000000001")]))
        // Unpadded, URL-safe base64 as some clients send it.
        let unpadded = params.replacingOccurrences(of: "=", with: "").replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        #expect(Aria2Request.fromQuery(method: "aria2.tellStatus", id: "foo", params: unpadded) == body)
        #expect(Aria2Request.fromQuery(method: "m", id: "1", params: "!!!") == nil)
        #expect(Aria2Request.fromQuery(method: nil, id: nil, params: nil) == nil)
    }
}
