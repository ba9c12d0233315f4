import ArgumentParser
import Foundation
import Pickup
import PickupDaemon

/// What the client commands share: finding the daemon and turning its errors into exit codes.
enum Remote {
    static func client(_ state: DaemonState) throws -> DaemonClient {
        do throws(DaemonClientError) {
            return try DaemonClient.find(stateDirectory: state.path)
        } catch {
            throw fail(error)
        }
    }

    /// Runs a call; a failure prints one line and exits with its code: 3 when the daemon cannot
    /// be reached, 4 when it answered with a server error, 2 for anything it refused.
    static func call<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let e as DaemonClientError {
            throw fail(e)
        }
    }

    static func fail(_ error: DaemonClientError) -> ExitCode {
        FileHandle.standardError.write(Data("pickup: \(error)\n".utf8))
        switch error {
        case .noDaemon, .unreachable: return ExitCode(Exit.network)
        case .api(let status, _, _): return ExitCode(status >= 500 ? Exit.server : Exit.usage)
        }
    }

    static func row(_ d: APIDownload) -> String {
        var size = ByteCount.format(d.bytesDone)
        if let total = d.totalBytes { size += " / " + ByteCount.format(total) }
        let percent = d.fraction.map { String(format: "%.1f%%", $0 * 100) } ?? ""
        let speed = d.state == "running" ? ByteCount.format(Int64(d.bytesPerSecond)) + "/s" : ""
        let left = d.state == "running" ? (d.secondsLeft.map(ProgressText.duration) ?? "") : ""
        let why = d.error.map { "  (\($0.message))" } ?? ""
        return columns(String(d.id), d.state, percent, size, speed, left) + (d.name ?? d.url) + why
    }

    static func header() -> String { columns("ID", "STATE", "%", "SIZE", "SPEED", "LEFT") + "NAME" }

    private static func columns(_ id: String, _ state: String, _ percent: String, _ size: String, _ speed: String,
                                _ left: String) -> String {
        func pad(_ s: String, _ n: Int, right: Bool = false) -> String {
            let fill = String(repeating: " ", count: max(0, n - s.count))
            return right ? fill + s : s + fill
        }
        return pad(id, 6, right: true) + "  " + pad(state, 10) + pad(percent, 7, right: true) + "  " + pad(size, 24)
            + pad(speed, 12) + pad(left, 8)
    }

    /// A line on standard output, unbuffered (a pipe reader sees it at once).
    static func say(_ text: String, terminator: String = "\n") {
        FileHandle.standardOutput.write(Data((text + terminator).utf8))
    }

}

struct Add: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "add", abstract: "Add downloads to the running daemon.")

    @Argument(help: "http, https or ftp URLs.") var urls: [String]
    @Option(name: [.customShort("o"), .customLong("output")], help: ArgumentHelp(
        "File name (or relative path) inside the daemon's download root; one URL only.", valueName: "name"))
    var name: String?
    @Option(help: "Higher starts first.") var priority: Int?
    @Option(help: ArgumentHelp("Verify the finished file, e.g. sha-256=HEX.", valueName: "algo=hex")) var checksum: String?
    @Option(name: [.customShort("x"), .long], help: ArgumentHelp("Connections for these downloads, 1 to 32.", valueName: "n"))
    var connections: Int?
    @Flag(help: "Add them paused.") var paused = false
    @Option(help: ArgumentHelp("Speed limit of each of these downloads, bytes per second with an optional K, M or G.", valueName: "rate"))
    var limitRate: String?
    @Option(name: [.customShort("H"), .customLong("header")], help: ArgumentHelp(
        "Send this header with every request of these downloads (repeatable); Authorization and Cookie go only to the URL's origin.",
        valueName: "name: value"))
    var headers: [String] = []
    @OptionGroup var daemonState: DaemonState

    func validate() throws {
        guard !Validation.skipped else { return }
        if urls.isEmpty { throw ValidationError("give at least one URL") }
        for h in headers {
            do throws(PickupError) { _ = try RequestHeader(line: h) } catch { throw ValidationError(error.description) }
        }
        if name != nil && urls.count > 1 { throw ValidationError("-o names one file; give one URL with it") }
        if let limitRate, Get.rate(limitRate) == nil {
            throw ValidationError("--limit-rate must be a number of bytes per second of at least 1K (1024), optionally with K, M or G")
        }
    }

    /// `-H` lines as the API takes them (checked in validate).
    var headerFields: [String: String]? {
        let fields = headers.compactMap { try? RequestHeader(line: $0) }
        return fields.isEmpty ? nil : Dictionary(fields.map { ($0.name, $0.value) }, uniquingKeysWith: { $1 })
    }

    func run() async throws {
        let client = try Remote.client(daemonState)
        for url in urls {
            let d = try await Remote.call {
                try await client.add(APIAddRequest(url: url, name: name, priority: priority, checksum: checksum,
                                                   connections: connections, speedLimit: limitRate.flatMap(Get.rate),
                                                   paused: paused ? true : nil, headers: headerFields))
            }
            print("added \(d.id) \(d.name ?? d.url) (\(d.state))")
        }
    }
}

struct List: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ls", abstract: "List the daemon's downloads.")

    @Argument(help: "Only those in this state: waiting, running, paused, completed or failed.") var only: String?
    @Option(help: ArgumentHelp("Only the downloads of exactly this URL.", valueName: "url")) var url: String?
    @Flag(help: "Print the downloads as the API gives them: a JSON array.") var json = false
    @OptionGroup var daemonState: DaemonState

    func validate() throws {
        guard !Validation.skipped else { return }
        if let only, DownloadState(rawValue: only) == nil {
            throw ValidationError("the state must be one of waiting, running, paused, completed, failed")
        }
    }

    func run() async throws {
        let client = try Remote.client(daemonState)
        let all = try await Remote.call { try await client.list(state: only, url: url) }
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            Remote.say(String(decoding: try encoder.encode(all), as: UTF8.self))
            return
        }
        print(Remote.header())
        for d in all { print(Remote.row(d)) }
    }
}

/// `pause` and `resume`: one download or all of them.
struct IDOrAll: ParsableArguments {
    @Argument(help: "The download's id (see 'pickup ls').") var id: Int64?
    @Flag(help: "Every download.") var all = false

    func validate() throws {
        guard !Validation.skipped else { return }
        if (id == nil) == !all { throw ValidationError("give an id or --all") }
    }

    /// Does `one` to the download named, or `all`, and prints the one download as it is then.
    func apply(_ state: DaemonState, one: @escaping (DaemonClient, Int64) async throws -> APIDownload,
               all: @escaping (DaemonClient) async throws -> Void) async throws {
        let client = try Remote.client(state)
        if let id {
            print(Remote.row(try await Remote.call { try await one(client, id) }))
        } else {
            try await Remote.call { try await all(client) }
        }
    }
}

struct Pause: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "pause", abstract: "Pause a download of the daemon, or all of them.")
    @OptionGroup var target: IDOrAll
    @OptionGroup var daemonState: DaemonState

    func run() async throws {
        try await target.apply(daemonState, one: { try await $0.pause($1) }, all: { try await $0.pauseAll() })
    }
}

struct Resume: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "resume", abstract: "Resume (or retry) a download of the daemon, or all paused ones.")
    @OptionGroup var target: IDOrAll
    @OptionGroup var daemonState: DaemonState

    func run() async throws {
        try await target.apply(daemonState, one: { try await $0.resume($1) }, all: { try await $0.resumeAll() })
    }
}

struct Remove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm", abstract: "Remove a download from the daemon; its files stay on disk unless asked.",
        discussion: """
            An unfinished download's partial file (NAME.pickup-part, with its .pickup-ctl and .pickup-pos files) stays \
            where it is unless --delete-partial: \
            `pickup get` of the same URL into the same directory (or -o the same path) resumes from it.
            """)
    @Argument(help: "The download's id.") var id: Int64?
    @Flag(help: "Remove every completed download instead (their files stay unless --delete-file).") var completed = false
    @Flag(help: "Remove every failed download instead (their partial files stay unless --delete-partial).") var failed = false
    @Flag(help: "Delete the finished file too.") var deleteFile = false
    @Flag(help: "Delete an unfinished (or failed) download's partial file and its control files too.") var deletePartial = false
    @OptionGroup var daemonState: DaemonState

    func validate() throws {
        guard !Validation.skipped else { return }
        if [id != nil, completed, failed].filter({ $0 }).count != 1 { throw ValidationError("give an id, --completed or --failed") }
    }

    func run() async throws {
        let client = try Remote.client(daemonState)
        if let id {
            try await Remote.call { try await client.remove(id, deleteFile: deleteFile, deletePartial: deletePartial) }
            return
        }
        let state = completed ? "completed" : "failed"
        let r = try await Remote.call { try await client.removeAll(state: state, deleteFile: deleteFile, deletePartial: deletePartial) }
        print("removed \(r.removed) \(state) download\(r.removed == 1 ? "" : "s")")
    }
}

struct SetCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set", abstract: "Change a download of the daemon: its priority, its speed limit, or make it the next to start.")
    @Argument(help: "The download's id.") var id: Int64
    @Option(help: "Higher starts first, -1000 to 1000.") var priority: Int?
    @Option(help: ArgumentHelp("Its speed limit in bytes per second with an optional K, M or G, or 'none'.", valueName: "rate"))
    var limitRate: String?
    @Flag(help: "Make it the next to start among the waiting ones.") var front = false
    @OptionGroup var daemonState: DaemonState

    func validate() throws {
        guard !Validation.skipped else { return }
        if priority == nil, limitRate == nil, !front { throw ValidationError("give --priority, --limit-rate or --front") }
        if let limitRate, limitRate != "none", Get.rate(limitRate) == nil {
            throw ValidationError("--limit-rate must be 'none' or a number of bytes per second of at least 1K (1024), optionally with K, M or G")
        }
    }

    func run() async throws {
        let client = try Remote.client(daemonState)
        var limit: Int64?? = nil
        if let limitRate { limit = .some(limitRate == "none" ? nil : Get.rate(limitRate)) }
        let patch = APIDownloadPatch(priority: priority, speedLimit: limit, position: front ? "front" : nil)
        print(Remote.row(try await Remote.call { try await client.change(id, patch) }))
    }
}

struct Watch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Show the daemon's downloads live, until interrupted (on a pipe: a line per change).",
        discussion: """
            With --until-done it exits once nothing is waiting or running: 0 when no download failed, \
            else the failure's exit code (1 for failures of several kinds).
            """)
    @Flag(help: "Exit once nothing is waiting or running.") var untilDone = false
    @OptionGroup var daemonState: DaemonState

    func run() async throws {
        let client = try Remote.client(daemonState)
        let tty = isatty(STDOUT_FILENO) != 0
        var downloads: [Int64: APIDownload] = [:]
        var totals: APITotals?
        var lastDraw = Date.distantPast
        let decoder = JSONDecoder()
        // The daemon ends the stream of a client that falls far behind: follow it again (a fresh
        // snapshot) for as long as the daemon answers.
        repeat {
            try await Remote.call { try await follow() }
            if let code = doneCode() { throw ExitCode(code) }
        } while (try? await client.settings()) != nil
        Remote.say("pickup: the daemon stopped")

        /// With --until-done, once nothing waits or runs: the exit status the failures give.
        func doneCode() -> Int32? {
            guard untilDone, let t = totals, (t.counts["running"] ?? 0) == 0, (t.counts["waiting"] ?? 0) == 0 else { return nil }
            let kinds = Set(downloads.values.filter { $0.state == "failed" }.compactMap { $0.error?.code })
            if kinds.isEmpty { return Exit.success }
            return kinds.count == 1 ? PickupError.Category(rawValue: kinds.first!).map(Get.code(for:)) ?? Exit.failure : Exit.failure
        }

        func follow() async throws {
            for try await (event, data) in client.events() {
                switch event {
                case "snapshot":
                    let s = try decoder.decode(APISnapshot.self, from: data)
                    let before = downloads
                    downloads = Dictionary(uniqueKeysWithValues: s.downloads.map { ($0.id, $0) })
                    totals = s.totals
                    if !tty { for d in s.downloads where before[d.id]?.state != d.state { Remote.say(Remote.row(d)) } }
                case "added", "changed":
                    let d = try decoder.decode(APIDownload.self, from: data)
                    let before = downloads[d.id]?.state
                    downloads[d.id] = d
                    if !tty, before != d.state { Remote.say(Remote.row(d)) }
                case "progress":
                    let p = try decoder.decode(APIProgress.self, from: data)
                    downloads[p.id]?.bytesDone = p.bytesDone
                    downloads[p.id]?.totalBytes = p.totalBytes
                    downloads[p.id]?.fraction = p.fraction
                    downloads[p.id]?.bytesPerSecond = p.bytesPerSecond
                    downloads[p.id]?.secondsLeft = p.secondsLeft
                case "totals": totals = try decoder.decode(APITotals.self, from: data)
                case "removed":
                    let r = try decoder.decode(APIRef.self, from: data)
                    downloads[r.id] = nil
                    if !tty { Remote.say("removed \(r.id)") }
                default: break
                }
                if event == "snapshot" || event == "totals", doneCode() != nil { return }
                guard tty, Date().timeIntervalSince(lastDraw) >= 0.25 else { continue }
                lastDraw = Date()
                var screen = "\u{1B}[H\u{1B}[2J" + Remote.header() + "\n"
                for d in downloads.values.sorted(by: { $0.id < $1.id }) { screen += Remote.row(d) + "\n" }
                if let t = totals {
                    screen += "\n\(t.counts["running"] ?? 0) running, \(t.counts["waiting"] ?? 0) waiting, "
                        + "\(t.counts["completed"] ?? 0) completed, \(t.counts["failed"] ?? 0) failed; "
                        + ByteCount.format(Int64(t.bytesPerSecond)) + "/s\n"
                }
                Remote.say(screen, terminator: "")
            }
        }
    }
}
