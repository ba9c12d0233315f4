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

    let driver: Child
    let base: String
    private(set) var session = ""

    init(width: Int, height: Int) async throws {
        let port = try Nginx.freePort()
        base = "http://127.0.0.1:\(port)"
        // (Its process group holds the browsers it starts: ``close()`` ends them with it.)
        driver = try await Child.start(Self.driverPath!, ["--port=\(port)"])
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
        try await viewport(width: width, height: height)
    }

    /// A Chrome DevTools Protocol command, through chromedriver.
    @discardableResult
    func cdp(_ command: String, _ params: [String: Any] = [:]) async throws -> [String: Any] {
        try await send(.POST, "/session/\(session)/goog/cdp/execute", ["cmd": command, "params": params])
    }

    /// The page's viewport exactly this size (a window cannot be made as narrow as a phone);
    /// below 600 px wide, as a phone's.
    func viewport(width: Int, height: Int) async throws {
        try await cdp("Emulation.setDeviceMetricsOverride",
                      ["width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600])
    }

    /// Emulates `prefers-color-scheme: dark` (or light).
    func darkMode(_ dark: Bool) async throws {
        try await cdp("Emulation.setEmulatedMedia", ["features": [["name": "prefers-color-scheme", "value": dark ? "dark" : "light"]]])
    }

    /// Every visible control (button, input, select, textarea, summary) that does not lie inside
    /// the viewport's width, and whether the page scrolls sideways.
    func controlsOutsideViewport() async throws -> [String] {
        let v = try await script("""
            const out = [];
            // The layout viewport: a phone zooms out (innerWidth grows) when the page is wider.
            const w = document.documentElement.clientWidth;
            if (document.documentElement.scrollWidth > w) {
              out.push('the page is ' + document.documentElement.scrollWidth + ' px wide in ' + w);
              for (const e of document.querySelectorAll('body *')) {
                const r = e.getBoundingClientRect();
                if (r.right > w + 0.5 && !e.closest('[hidden]')) out.push(e.tagName + '.' + e.className + ' ' + Math.round(r.left) + '..' + Math.round(r.right));
              }
              const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
              for (let t = walk.nextNode(); t; t = walk.nextNode()) {
                const range = document.createRange();
                range.selectNodeContents(t);
                const r = range.getBoundingClientRect();
                // (Text an element clips, as a long name cut with an ellipsis, is inside.)
                if (r.right > w + 0.5 && getComputedStyle(t.parentElement).overflowX !== 'hidden') out.push('text "' + t.textContent.slice(0, 40) + '" in ' + t.parentElement.tagName + '.' + t.parentElement.className + ' ' + Math.round(r.left) + '..' + Math.round(r.right));
              }
            }
            for (const e of document.querySelectorAll('button, input, select, textarea, summary')) {
              const r = e.getBoundingClientRect();
              if (r.width === 0 && r.height === 0) continue;
              if (getComputedStyle(e).visibility === 'hidden') continue;
              if (r.left < 0 || r.right > w) {
                const li = e.closest('li[data-id]');
                out.push((li ? 'row ' + li.dataset.id + ' ' : '') + (e.id || e.className || e.tagName) + ': ' + Math.round(r.left) + '..' + Math.round(r.right) + ' in 0..' + w);
              }
            }
            return out;
            """)
        return v as? [String] ?? ["no answer"]
    }

    /// The texts of the visible rows' `css` part, in the page's order.
    func rows(_ css: String = ".name") async throws -> [String] {
        let v = try await script("return [...document.querySelectorAll('#downloads li:not([hidden])')].map(li => li.querySelector('\(css)').textContent)")
        return v as? [String] ?? []
    }

    /// Sets a select's value (or an input's) as a person would, with its change event.
    func choose(_ id: String, _ value: String, event: String = "change") async throws {
        _ = try await script("const e = document.getElementById('\(id)'); e.value = '\(value)'; e.dispatchEvent(new Event('\(event)')); return true")
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
        await driver.stop()
    }

    /// Polls (bounded) until `condition` holds.
    func waitFor(_ what: String, seconds: Double = 60, _ condition: () async throws -> Bool) async throws {
        if try await eventually(seconds: seconds, every: 0.05, condition) { return }
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
    /// (adding-phone.png in ``screenshots``).
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
            try png.write(to: Self.screenshots.appendingPathComponent("adding-phone.png"))

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
            // The settings are folded while there are downloads.
            #expect(try await browser.script("return document.getElementById('settings').open") as? Bool == false)
            try await browser.click("#settings summary")
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
            // Clicked again until the question is open: under load a click can land while the list
            // redraws the row (its button replaced), and is lost.
            let askToRemove = { (id: Int64) in
                try await browser.waitFor("the question") {
                    if try await isOpen() { return true }
                    try? await browser.click(#"li[data-id="\#(id)"] .remove"#)
                    return try await isOpen()
                }
            }

            // Asked first; Cancel removes nothing.
            try await askToRemove(drop.id)
            let text = try await browser.script("return document.getElementById('remove-text').textContent") as? String
            #expect(text?.contains("partial file stays") == true, "\(text ?? "")")
            #expect(try await browser.script("return document.getElementById('remove-partial').checked") as? Bool == false)
            try await browser.click("#remove-cancel")
            try await browser.waitFor("the question to close") { try await !isOpen() }

            // Removed without ticking: the partial file stays.
            try await askToRemove(keep.id)
            try await browser.click("#remove-confirm")
            try await browser.waitFor("keep.bin removed") { try await f.client.list().map(\.id) == [drop.id] }
            #expect(NothingLostTests.helpers(of: "keep.bin", in: f.root).contains("keep.bin.pickup-part"), "\(f.root.entries)")
            #expect(NothingLostTests.helpers(of: "keep.bin", in: f.root).contains("keep.bin.pickup-ctl"), "\(f.root.entries)")

            // Ticked: the partial file and its helpers go.
            try await askToRemove(drop.id)
            try await browser.click("#remove-partial")
            try await browser.click("#remove-confirm")
            try await browser.waitFor("drop.bin removed") { try await f.client.list().isEmpty }
            try await browser.waitFor("drop.bin's partial file deleted") { NothingLostTests.helpers(of: "drop.bin", in: f.root).isEmpty }
            #expect(NothingLostTests.helpers(of: "keep.bin", in: f.root).contains("keep.bin.pickup-part"), "\(f.root.entries)")
        }
    }

    /// Where the tests' screenshots go: a directory under the temporary directory, kept for a
    /// person to look at (phone-light.png, desktop-dark.png, ...).
    static let screenshots: URL = {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("pickup-web-ui")
        try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        return dir
    }()

    /// Several downloads in every state at phone (390x844) and desktop (1280x800) widths, light
    /// and dark: every visible control lies inside the viewport (folded, and with everything
    /// unfolded), the add form is folded once downloads exist, dark mode darkens the page, a
    /// download held by its own limit says so (not "slow server"), limits show their units, the
    /// speed graph draws. Screenshots of each go to ``screenshots``.
    @Test(.enabled(if: Browser.driverPath != nil && Browser.chromiumPath != nil, "needs chromium and chromedriver"))
    func thePageFitsPhoneAndDesktopInLightAndDark() async throws {
        let f = try await DaemonFixture { $0.maxConcurrentDownloads = 2 }
        let big = Resource.bytes(count: 60_000_000, seed: 61)
        f.server.set("/releases/ubuntu-24.04.2-desktop-amd64.iso", Resource(body: big, bytesPerSecond: 900_000))
        f.server.set("/mirror/ubuntu-24.04.2-desktop-amd64.iso", Resource(body: big, bytesPerSecond: 900_000))
        f.server.set("/Fedora-Workstation-Live-x86_64-41-1.4.iso", Resource(body: Resource.bytes(count: 60_000_000, seed: 62)))
        f.server.set("/data/dataset-2024-part-1.parquet", Resource(body: Resource.bytes(count: 2_000_000, seed: 63)))
        f.server.set("/data/dataset-2024-part-2.parquet", Resource(body: Resource.bytes(count: 2_000_000, seed: 64)))
        f.server.set("/firmware/router-fw-v2.3.1.bin", Resource(body: Resource.bytes(count: 300_000, seed: 65)))
        f.server.set("/talks/keynote-recording-1080p.mp4", Resource(body: Resource.bytes(count: 2_000_000, seed: 66)))
        let u = f.server.url
        let done = try await f.client.add(APIAddRequest(url: u("/data/dataset-2024-part-1.parquet")))
        let bad = try await f.client.add(APIAddRequest(url: u("/firmware/router-fw-v2.3.1.bin"),
                                                       checksum: "sha-256=" + String(repeating: "ab", count: 32)))
        try await f.waitUntil { $0[done.id]?.state == "completed" && $0[bad.id]?.state == "failed" }
        let mirror = u("/mirror/ubuntu-24.04.2-desktop-amd64.iso").replacingOccurrences(of: "http://", with: "http://mirror:s3cret@")
        let ubuntu = try await f.client.add(APIAddRequest(url: u("/releases/ubuntu-24.04.2-desktop-amd64.iso"), connections: 2,
                                                          headers: ["X-Token": "t1"], urls: [mirror]))
        let fedora = try await f.client.add(APIAddRequest(url: u("/Fedora-Workstation-Live-x86_64-41-1.4.iso"), speedLimit: 204_800))
        let waiting = try await f.client.add(APIAddRequest(url: u("/talks/keynote-recording-1080p.mp4")))
        let paused = try await f.client.add(APIAddRequest(url: u("/data/dataset-2024-part-2.parquet"), paused: true))
        try await withBrowser(f, width: 390, height: 844) { browser in
            try await browser.open(f.baseURL + "/")
            try await browser.logIn(f.daemon.token)
            try await browser.waitFor("every state on the page") {
                try await browser.states() == ["\(done.id)": "completed", "\(bad.id)": "failed", "\(ubuntu.id)": "running",
                                               "\(fedora.id)": "running", "\(waiting.id)": "waiting", "\(paused.id)": "paused"]
            }
            let fedoraRow = #"li[data-id="\#(fedora.id)"]"#
            // Held by its own limit: the page says so, with the limit's unit, and blames no server.
            try await browser.waitFor("the limit named as what holds Fedora") {
                let why = try await browser.script("return document.querySelector('\(fedoraRow) .why').textContent") as? String ?? ""
                return why.contains("its own speed limit, 200 KiB/s")
            }
            let why = try await browser.script("return document.querySelector('\(fedoraRow) .why').textContent") as? String ?? ""
            #expect(!why.contains("server"), "\(why)")
            let numbers = try await browser.script("return document.querySelector('\(fedoraRow) .numbers').textContent") as? String ?? ""
            #expect(numbers.contains("limit 200 KiB/s"), "\(numbers)")
            // The speed graph has a few seconds of samples, its scale with a unit.
            try await browser.waitFor("the speed graph") {
                let n = try await browser.script("return (document.querySelector('#total-graph polyline')?.getAttribute('points') || '').split(' ').filter(Boolean).length") as? Int ?? 0
                return n >= 3
            }
            let caption = try await browser.script("return document.querySelector('#total-graph figcaption').textContent") as? String ?? ""
            #expect(caption.contains("/s") && caption.contains("60 s"), "\(caption)")

            for (name, width, height) in [("phone", 390, 844), ("desktop", 1280, 800)] {
                try await browser.viewport(width: width, height: height)
                try await browser.open(f.baseURL + "/")   // the token is remembered
                try await browser.waitFor("the rows at \(name) width") { try await browser.states().count == 6 }
                let inner = try await browser.script("return [window.innerWidth, window.innerHeight, document.documentElement.clientWidth]") as? [Int]
                #expect(inner?.first == width, "\(name): \(inner ?? [])")
                #expect(try await browser.script("return document.getElementById('add-panel').open") as? Bool == false,
                        "the add form is folded once there are downloads")
                do { let outside = try await browser.controlsOutsideViewport(); #expect(outside == [], "\(name), folded: \(outside)") }
                try await browser.click(#"li[data-id="\#(ubuntu.id)"] .more"#)
                try await browser.waitFor("the details") {
                    try await browser.script(#"return document.querySelector('li[data-id="\#(ubuntu.id)"] .item-graph polyline') != null"#) as? Bool == true
                }
                // Give the graph a few samples after the reload.
                try await browser.waitFor("the graph after the reload") {
                    let n = try await browser.script("return (document.querySelector('#total-graph polyline')?.getAttribute('points') || '').split(' ').filter(Boolean).length") as? Int ?? 0
                    return n >= 4
                }
                // Still its limit, not the server, however its connections fare under it.
                let held = try await browser.script("return document.querySelector('\(fedoraRow) .why').textContent") as? String ?? ""
                #expect(held.isEmpty || held.hasPrefix("Held to its own speed limit"), "\(name): \(held)")
                do { let outside = try await browser.controlsOutsideViewport(); #expect(outside == [], "\(name), details open: \(outside)") }
                for dark in [false, true] {
                    try await browser.darkMode(dark)
                    let background = try await browser.script("return getComputedStyle(document.body).backgroundColor") as? String ?? ""
                    #expect(Self.isDark(background) == dark, "\(name) \(dark ? "dark" : "light"): \(background)")
                    try await browser.screenshot().write(to: Self.screenshots.appendingPathComponent("\(name)-\(dark ? "dark" : "light").png"))
                }
                try await browser.darkMode(false)
                try await browser.click("#add-panel summary")
                try await browser.click("#settings summary")
                do { let outside = try await browser.controlsOutsideViewport(); #expect(outside == [], "\(name), everything unfolded: \(outside)") }
                try await browser.screenshot().write(to: Self.screenshots.appendingPathComponent("\(name)-unfolded.png"))
            }
        }
    }

    /// Whether a CSS `rgb(r, g, b)` is a dark colour.
    static func isDark(_ css: String) -> Bool {
        let n = css.split(whereSeparator: { !"0123456789.".contains($0) }).compactMap { Double($0) }
        guard n.count >= 3 else { return false }
        return 0.2126 * n[0] + 0.7152 * n[1] + 0.0722 * n[2] < 80
    }

    /// Sorting (name, state, progress, added; both directions), filtering (by state, by text),
    /// and a download's details: its mirrors without credentials, headers' names only, its
    /// connections, file and error; and the words for what holds a download (its limit, the
    /// global one, a slow server or connection).
    @Test(.enabled(if: Browser.driverPath != nil && Browser.chromiumPath != nil, "needs chromium and chromedriver"))
    func thePageSortsFiltersAndShowsDetails() async throws {
        let f = try await DaemonFixture()
        for (path, seed) in [("/alpha.bin", 71), ("/bravo.bin", 72), ("/charlie.bin", 73), ("/m/bravo.bin", 72)] {
            f.server.set(path, Resource(body: Resource.bytes(count: 100_000, seed: UInt64(seed))))
        }
        let alpha = try await f.client.add(APIAddRequest(url: f.server.url("/alpha.bin")))
        let mirror = f.server.url("/m/bravo.bin").replacingOccurrences(of: "http://", with: "http://joe:hunter2@")
        let bravo = try await f.client.add(APIAddRequest(url: f.server.url("/bravo.bin"), checksum: "sha-256=" + String(repeating: "0", count: 64),
                                                         connections: 2, headers: ["Authorization": "Bearer zz-secret-token"], urls: [mirror]))
        try await f.waitUntil { $0[alpha.id]?.state == "completed" && $0[bravo.id]?.state == "failed" }
        let charlie = try await f.client.add(APIAddRequest(url: f.server.url("/charlie.bin"), paused: true))
        try await withBrowser(f, width: 1280, height: 800) { browser in
            try await browser.open(f.baseURL + "/")
            try await browser.logIn(f.daemon.token)
            try await browser.waitFor("the rows") { try await browser.states().count == 3 }
            // Added, newest first by default.
            #expect(try await browser.rows() == ["charlie.bin", "bravo.bin", "alpha.bin"])
            try await browser.choose("sort", "name")
            #expect(try await browser.rows() == ["alpha.bin", "bravo.bin", "charlie.bin"])
            try await browser.click("#sort-direction")
            #expect(try await browser.rows() == ["charlie.bin", "bravo.bin", "alpha.bin"])
            try await browser.choose("sort", "state")
            #expect(try await browser.rows() == ["charlie.bin", "bravo.bin", "alpha.bin"], "paused, failed, completed")
            try await browser.choose("sort", "progress")
            #expect(try await browser.rows().last == "charlie.bin", "the one with nothing yet last")
            try await browser.choose("sort", "added")
            try await browser.click("#sort-direction")
            #expect(try await browser.rows() == ["alpha.bin", "bravo.bin", "charlie.bin"], "oldest first")

            try await browser.choose("filter-state", "completed")
            #expect(try await browser.rows() == ["alpha.bin"])
            #expect(try await browser.script("return document.getElementById('shown').textContent") as? String == "1 of 3 shown")
            try await browser.choose("filter-state", "")
            try await browser.type("#filter-text", "CHAR")
            #expect(try await browser.rows() == ["charlie.bin"])
            try await browser.choose("filter-text", "nothing-like-it", event: "input")
            #expect(try await browser.rows() == [])
            #expect(try await browser.script("return document.getElementById('empty').textContent") as? String == "No download matches the filter.")
            try await browser.choose("filter-text", "", event: "input")
            #expect(try await browser.rows().count == 3)
            // The view is kept across a reload.
            try await browser.open(f.baseURL + "/")
            try await browser.waitFor("the rows again") { try await browser.rows() == ["alpha.bin", "bravo.bin", "charlie.bin"] }
            #expect(try await browser.script("return document.getElementById('sort').value") as? String == "added")

            // Details: what the API says, no credential, no header value.
            let row = #"li[data-id="\#(bravo.id)"]"#
            #expect(try await browser.script("return document.querySelector('\(row) .more-panel').hidden") as? Bool == true)
            try await browser.click("\(row) .more")
            let facts = try await browser.script("""
                const out = {};
                for (const dt of document.querySelectorAll('\(row) .facts dt')) out[dt.textContent] = dt.nextElementSibling.textContent;
                return out;
                """) as? [String: String] ?? [:]
            #expect(facts["Mirrors"]?.contains("***@127.0.0.1") == true, "\(facts)")
            #expect(facts["Connections"]?.contains("2") == true, "\(facts)")
            #expect(facts["Headers sent"]?.contains("Authorization") == true, "\(facts)")
            #expect(facts["Error"]?.hasPrefix("verification") == true, "\(facts)")
            let panel = try await browser.script("return document.querySelector('\(row) .more-panel').textContent") as? String ?? ""
            #expect(!panel.contains("hunter2") && !panel.contains("zz-secret"), "\(panel)")
            try await browser.click("\(row) .more")
            #expect(try await browser.script("return document.querySelector('\(row) .more-panel').hidden") as? Bool == true)
            try await browser.click(#"li[data-id="\#(alpha.id)"] .more"#)
            let file = try await browser.script(#"return document.querySelector('li[data-id="\#(alpha.id)"] dt[data-fact="File"]').nextElementSibling.textContent"#) as? String
            #expect(file == "alpha.bin (in the download folder)")

            // The words for what holds a running download, from what the API says of it.
            _ = try await browser.script("showSettings({maxConcurrentDownloads: 3, speedLimit: 1048576, order: 'fifo', startsAllAtOnce: false}); return true")
            let words = try await browser.script("""
                const d = { state: 'running', bytesPerSecond: 1000, speedLimit: 204800 };
                return [why({ ...d, limitedBy: 'download' }), why({ ...d, limitedBy: 'global' }),
                        why({ ...d, stallTimeout: 30 }), why({ ...d, limitedBy: 'download', stallTimeout: 30 }), why(d),
                        why({ state: 'waiting' })];
                """) as? [String] ?? []
            #expect(words == ["Held to its own speed limit, 200 KiB/s",
                              "Held to the global speed limit, 1 MiB/s for all downloads together",
                              "The server or the connection to it is slow: waiting up to 30 s for its data",
                              "Held to its own speed limit, 200 KiB/s",
                              "",
                              "Waiting its turn: 3 downloads run at once"], "\(words)")
            _ = charlie
        }
    }
}
