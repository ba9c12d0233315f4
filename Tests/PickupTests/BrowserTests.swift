import AsyncHTTPClient
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import NIOCore
import NIOHTTP1
import PickupDaemon
import Testing
import TestServer

/// A headless Chromium driven through chromedriver's W3C WebDriver API.
final class Browser: @unchecked Sendable {
    static let driverPath = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }
    static let chromiumPath = ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }

    let driver: Process
    let base: String
    private(set) var session = ""

    init(width: Int, height: Int) async throws {
        let port = Self.freePort()
        base = "http://127.0.0.1:\(port)"
        driver = Process()
        driver.executableURL = URL(fileURLWithPath: Self.driverPath!)
        driver.arguments = ["--port=\(port)"]
        driver.standardOutput = FileHandle.nullDevice
        driver.standardError = FileHandle.nullDevice
        try driver.runWithSignalsUnblocked()
        try await waitFor("chromedriver to start") { (try? await self.send(.GET, "/status")) != nil }
        let capabilities: [String: Any] = ["capabilities": ["alwaysMatch": [
            "browserName": "chrome",
            "goog:chromeOptions": [
                "binary": Self.chromiumPath!,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=\(width),\(height)"],
            ] as [String: Any],
        ] as [String: Any]]]
        let created = try await send(.POST, "/session", capabilities)
        session = try #require(created["sessionId"] as? String)
    }

    func open(_ url: String) async throws { _ = try await send(.POST, "/session/\(session)/url", ["url": url]) }

    func element(_ css: String) async throws -> String {
        let found = try await send(.POST, "/session/\(session)/element", ["using": "css selector", "value": css])
        return try #require(found.values.first as? String, "no element \(css)")
    }

    func click(_ css: String) async throws {
        _ = try await send(.POST, "/session/\(session)/element/\(try await element(css))/click", [:])
    }

    func type(_ css: String, _ text: String) async throws {
        _ = try await send(.POST, "/session/\(session)/element/\(try await element(css))/value", ["text": text])
    }

    /// Runs JavaScript in the page and returns its result.
    func script(_ js: String) async throws -> Any? {
        let r = try await send(.POST, "/session/\(session)/execute/sync", ["script": js, "args": []], raw: true)
        return r["value"]
    }

    /// The states shown on the page, by download id.
    func states() async throws -> [String: String] {
        let v = try await script("""
            const out = {};
            for (const li of document.querySelectorAll('#downloads li')) out[li.dataset.id] = li.querySelector('.state').textContent;
            return out;
            """)
        return v as? [String: String] ?? [:]
    }

    /// Gives the page the token at its login form.
    func logIn(_ token: String) async throws {
        try await waitFor("the token form") { try await script("return !document.getElementById('login').hidden") as? Bool == true }
        try await type("#token", token)
        try await click("#token-form button")
    }

    func screenshot() async throws -> Data {
        let r = try await send(.GET, "/session/\(session)/screenshot", raw: true)
        return try #require(Data(base64Encoded: r["value"] as? String ?? ""))
    }

    func close() async {
        _ = try? await send(.DELETE, "/session/\(session)")
        kill(driver.processIdentifier, SIGKILL)
        driver.waitUntilExit()
    }

    /// Polls (bounded) until `condition` holds.
    func waitFor(_ what: String, seconds: Double = 60, _ condition: () async throws -> Bool) async throws {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if try await condition() { return }
            try await Task.sleep(for: .milliseconds(50))
        }
        Issue.record("gave up waiting for \(what)")
        throw CancellationError()
    }

    private func send(_ method: HTTPMethod, _ path: String, _ body: [String: Any]? = nil, raw: Bool = false) async throws -> [String: Any] {
        var r = HTTPClientRequest(url: base + path)
        r.method = method
        if let body {
            r.headers.add(name: "Content-Type", value: "application/json")
            r.body = .bytes(ByteBuffer(bytes: try JSONSerialization.data(withJSONObject: body)))
        }
        let response = try await HTTPClient.shared.execute(r, timeout: .seconds(60))
        let bytes = try await response.body.collect(upTo: 32 << 20)
        let json = try JSONSerialization.jsonObject(with: Data(buffer: bytes), options: [.fragmentsAllowed]) as? [String: Any] ?? [:]
        guard response.status == .ok else { throw CocoaError(.featureUnsupported, userInfo: [NSLocalizedDescriptionKey: "\(path): \(json)"]) }
        if raw { return json }
        return json["value"] as? [String: Any] ?? json
    }

    static func freePort() -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { Glibc.close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) } }
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        return Int(UInt16(bigEndian: addr.sin_port))
    }
}

extension Data {
    init(buffer: ByteBuffer) { self = Data(buffer.readableBytesView) }
}

/// Runs `body` with a browser for the fixture's daemon; both are closed however it ends.
func withBrowser(_ f: DaemonFixture, width: Int, height: Int, _ body: (Browser) async throws -> Void) async throws {
    let browser = try await Browser(width: width, height: height)
    do {
        try await body(browser)
    } catch {
        Issue.record("\(error)")
        await browser.close()
        await f.close()
        throw error
    }
    await browser.close()
    await f.close()
}

@Suite(.serialized, .timeLimit(.minutes(3))) struct BrowserTests {
    /// The web page in a real browser at phone width: asks for the token, adds downloads from
    /// the form, shows them finish live, pauses and resumes one. Saves a screenshot
    /// (to `$PICKUP_SCREENSHOT` when set; docs/web-ui.png is one).
    @Test(.enabled(if: Browser.driverPath != nil && Browser.chromiumPath != nil, "needs chromium and chromedriver"))
    func thePageAddsWatchesPausesAndResumesDownloads() async throws {
        let f = try await DaemonFixture()
        let small = Resource.bytes(count: 3_000_000, seed: 1)
        let slow = Resource.bytes(count: 6_000_000, seed: 2)
        f.server.set("/ubuntu-24.04-netboot.tar.gz", Resource(body: small))
        f.server.set("/dataset-part-1.parquet", Resource(body: slow, bytesPerSecond: 400_000))
        f.server.set("/dataset-part-2.parquet", Resource(body: slow, bytesPerSecond: 700_000))
        try await withBrowser(f, width: 412, height: 915) { browser in
            try await browser.open(f.baseURL + "/")
            try await browser.logIn(f.daemon.token)
            try await browser.waitFor("the page to connect") {
                try await browser.script("return document.getElementById('status').textContent") as? String == "live"
            }
            let urls = ["/ubuntu-24.04-netboot.tar.gz", "/dataset-part-1.parquet", "/dataset-part-2.parquet"].map(f.server.url)
            try await browser.type("#urls", urls.joined(separator: "\n"))
            try await browser.click("#advanced summary")
            try await browser.type("#headers", "X-Token: t1")
            try await browser.type("#user-agent", "Agent/7.0")
            try await browser.click("#add-form button")
            try await browser.waitFor("the first download to finish on the page") {
                let s = try await browser.states()
                return s.count == 3 && s["1"] == "completed" && s["2"] == "running"
            }
            #expect(f.root.read("ubuntu-24.04-netboot.tar.gz") == small)
            // The advanced part's header and user agent went with the request; the page shows no value.
            let sent = f.server.requests("/ubuntu-24.04-netboot.tar.gz").first?.headers
            #expect(sent?["x-token"] == "t1")
            #expect(sent?["user-agent"] == "Agent/7.0")
            try await browser.click(#"li[data-id="2"] .pause"#)
            try await browser.waitFor("the paused state on the page") { try await browser.states()["2"] == "paused" }
            #expect(try await f.client.download(2).state == "paused")
            try await browser.waitFor("progress on the page") {
                let held = try await f.client.download(3).bytesDone
                let shown = try await browser.script(#"return document.querySelector('li[data-id="3"] .numbers').textContent"#) as? String
                return held > 500_000 && shown?.contains("%") == true
            }
            let png = try await browser.screenshot()
            #expect(png.starts(with: [0x89, 0x50, 0x4E, 0x47]))
            let target = ProcessInfo.processInfo.environment["PICKUP_SCREENSHOT"]
                ?? FileManager.default.temporaryDirectory.appendingPathComponent("pickup-web-ui.png").path
            try png.write(to: URL(fileURLWithPath: target))

            f.server.update("/dataset-part-1.parquet") { $0.bytesPerSecond = nil }
            f.server.update("/dataset-part-2.parquet") { $0.bytesPerSecond = nil }
            try await browser.click(#"li[data-id="2"] .resume"#)
            try await browser.waitFor("every download to finish on the page") {
                try await browser.states() == ["1": "completed", "2": "completed", "3": "completed"]
            }
            #expect(f.root.read("dataset-part-1.parquet") == slow)
            #expect(f.root.read("dataset-part-2.parquet") == slow)
        }
    }

    /// Lines added as mirrors of one file make one download that asks every mirror.
    @Test(.enabled(if: Browser.driverPath != nil && Browser.chromiumPath != nil, "needs chromium and chromedriver"))
    func thePageAddsLinesAsMirrorsOfOneFile() async throws {
        let f = try await DaemonFixture { $0.engine.connections = 4 }
        let body = Resource.bytes(count: 6_000_000, seed: 26)
        f.server.set("/m1/big.iso", Resource(body: body, etag: "\"one\"", bytesPerSecond: 2_000_000))
        f.server.set("/m2/big.iso", Resource(body: body, etag: "\"two\"", bytesPerSecond: 2_000_000))
        try await withBrowser(f, width: 412, height: 915) { browser in
            try await browser.open(f.baseURL + "/")
            try await browser.logIn(f.daemon.token)
            let urls = ["/m1/big.iso", "/m2/big.iso"].map(f.server.url)
            try await browser.type("#urls", urls.joined(separator: "\n"))
            try await browser.click("#as-mirrors")
            try await browser.click("#add-form button")
            try await browser.waitFor("the download to finish on the page") { try await browser.states() == ["1": "completed"] }
            let same = f.root.read("big.iso") == body
            #expect(same, "the file differs")
            #expect(try await f.client.download(1).mirrors == [urls[1]])
            #expect(f.server.requests("/m2/big.iso").contains { $0.status == 206 }, "\(f.server.requests("/m1/big.iso").map { ($0.status, $0.headers["range"] ?? "") })")
        }
    }

    /// The page's controls for what the manager can do: priority up and down, move to the front,
    /// a download's own limit, the order and batch-mode switches, clearing completed downloads.
    @Test(.enabled(if: Browser.driverPath != nil && Browser.chromiumPath != nil, "needs chromium and chromedriver"))
    func thePageChangesPrioritiesLimitsOrderAndClearsCompleted() async throws {
        let f = try await DaemonFixture { $0.maxConcurrentDownloads = 1 }
        f.server.set("/slow.bin", Resource(body: Resource.bytes(count: 4_000_000), bytesPerSecond: 200_000))
        f.server.set("/a.bin", Resource(body: Resource.bytes(count: 1000)))
        f.server.set("/b.bin", Resource(body: Resource.bytes(count: 1000)))
        _ = try await f.client.add(APIAddRequest(url: f.server.url("/slow.bin")))
        try await f.waitUntil { $0[1]?.state == "running" }
        _ = try await f.client.add(APIAddRequest(url: f.server.url("/a.bin")))
        _ = try await f.client.add(APIAddRequest(url: f.server.url("/b.bin")))
        try await withBrowser(f, width: 1000, height: 900) { browser in
            try await browser.open(f.baseURL + "/")
            try await browser.logIn(f.daemon.token)
            try await browser.waitFor("the downloads on the page") { try await browser.states().count == 3 }
            try await browser.click(#"li[data-id="3"] .up"#)
            try await browser.waitFor("b's priority raised") { try await f.client.download(3).priority == 1 }
            try await browser.click(#"li[data-id="2"] .down"#)
            try await browser.waitFor("a's priority lowered") { try await f.client.download(2).priority == -1 }
            try await browser.click(#"li[data-id="2"] .front"#)
            try await browser.waitFor("a moved to the front") { try await f.client.download(2).priority == 1 }
            _ = try await browser.script(#"const e = document.querySelector('li[data-id="1"] .item-limit'); e.value = '0.5'; e.dispatchEvent(new Event('change')); return true"#)
            try await browser.waitFor("the running one's limit") { try await f.client.download(1).speedLimit == 524_288 }
            _ = try await browser.script("const e = document.getElementById('order'); e.value = 'lifo'; e.dispatchEvent(new Event('change')); return true")
            try await browser.waitFor("LIFO") { try await f.client.settings().order == "lifo" }
            f.server.update("/slow.bin") { $0.bytesPerSecond = nil }
            try await browser.click("#all-at-once")
            try await browser.waitFor("batch mode") { try await f.client.settings().startsAllAtOnce }
            _ = try await f.client.pause(1)
            _ = try await f.client.resume(1)
            try await browser.waitFor("every download to finish on the page") {
                try await browser.states() == ["1": "completed", "2": "completed", "3": "completed"]
            }
            try await browser.click("#clear-completed")
            try await browser.waitFor("the list cleared on the page") { try await browser.states().isEmpty }
            #expect(try await f.client.list().isEmpty)
            #expect(f.root.read("a.bin") != nil, "clearing keeps the files")
        }
    }


    /// Remove on an unfinished download asks first (Cancel removes nothing), keeps its partial
    /// file unless "Delete the partial file too" is ticked, and deletes it when it is.
    @Test(.enabled(if: Browser.driverPath != nil && Browser.chromiumPath != nil, "needs chromium and chromedriver"))
    func removingAnUnfinishedDownloadAsksAndKeepsItsPartialFileUnlessTicked() async throws {
        let f = try await DaemonFixture()
        for name in ["keep.bin", "drop.bin"] {
            f.server.set("/" + name, Resource(body: Resource.bytes(count: 3_000_000, seed: 38), bytesPerSecond: 300_000))
        }
        let keep = try await f.client.add(APIAddRequest(url: f.server.url("/keep.bin"), name: "keep.bin"))
        let drop = try await f.client.add(APIAddRequest(url: f.server.url("/drop.bin"), name: "drop.bin"))
        try await f.waitUntil { ($0[keep.id]?.bytesDone ?? 0) > 200_000 && ($0[drop.id]?.bytesDone ?? 0) > 200_000 }
        _ = try await f.client.pause(keep.id)
        _ = try await f.client.pause(drop.id)
        try await f.waitUntil { $0[keep.id]?.state == "paused" && $0[drop.id]?.state == "paused" }
        try await withBrowser(f, width: 412, height: 915) { browser in
            try await browser.open(f.baseURL + "/")
            try await browser.logIn(f.daemon.token)
            try await browser.waitFor("the downloads on the page") { try await browser.states().count == 2 }
            let isOpen = { try await browser.script("return document.getElementById('remove-dialog').open") as? Bool == true }

            // Asked first; Cancel removes nothing.
            try await browser.click(#"li[data-id="\#(drop.id)"] .remove"#)
            try await browser.waitFor("the question") { try await isOpen() }
            let text = try await browser.script("return document.getElementById('remove-text').textContent") as? String
            #expect(text?.contains("partial file stays") == true, "\(text ?? "")")
            #expect(try await browser.script("return document.getElementById('remove-partial').checked") as? Bool == false)
            try await browser.click("#remove-cancel")
            try await browser.waitFor("the question to close") { try await !isOpen() }

            // Removed without ticking: the partial file stays.
            try await browser.click(#"li[data-id="\#(keep.id)"] .remove"#)
            try await browser.waitFor("the question") { try await isOpen() }
            try await browser.click("#remove-confirm")
            try await browser.waitFor("keep.bin removed") { try await f.client.list().map(\.id) == [drop.id] }
            #expect(NothingLostTests.helpers(of: "keep.bin", in: f.root).contains("keep.bin.pickup-part"), "\(f.root.entries)")
            #expect(NothingLostTests.helpers(of: "keep.bin", in: f.root).contains("keep.bin.pickup-ctl"), "\(f.root.entries)")

            // Ticked: the partial file and its helpers go.
            try await browser.click(#"li[data-id="\#(drop.id)"] .remove"#)
            try await browser.waitFor("the question") { try await isOpen() }
            try await browser.click("#remove-partial")
            try await browser.click("#remove-confirm")
            try await browser.waitFor("drop.bin removed") { try await f.client.list().isEmpty }
            try await browser.waitFor("drop.bin's partial file deleted") { NothingLostTests.helpers(of: "drop.bin", in: f.root).isEmpty }
            #expect(NothingLostTests.helpers(of: "keep.bin", in: f.root).contains("keep.bin.pickup-part"), "\(f.root.entries)")
        }
    }
}
