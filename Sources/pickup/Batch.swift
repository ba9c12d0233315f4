import ArgumentParser
import Foundation
import Pickup
import PickupDaemon
import SystemPackage

/// `pickup get -i FILE`: every URL of a list through a ``DownloadManager`` whose state lives in
/// the user's state directory, one per (list, output directory). Rerunning the same command
/// resumes the batch: finished files are not fetched again, partial ones continue.
struct Batch {
    let get: Get
    let inputFile: String
    /// `--metalink`: the file is a Metalink 4 document, each of its files an entry (its URLs by
    /// priority as mirrors, its strongest hash as the checksum, its piece hashes).
    var metalink = false
    /// The Metalink document `inputFile` (then a URL) answered with: its files are the batch.
    var document: Metalink? = nil
    /// The signal trap of the single download that turned into this batch.
    var trap: SignalTrap? = nil
    /// `-Z`: these URLs, each a file of its own, one after another (instead of a list file).
    var urls: [String]? = nil

    /// `-i -` reads the list from standard input.
    var fromStandardInput: Bool { inputFile == "-" && document == nil && !metalink }

    /// The list's name in messages.
    var listName: String { fromStandardInput ? "standard input" : inputFile }

    func run() async throws {
        let display = BatchDisplay(quiet: get.quiet)
        func fail(_ message: String, _ code: Int32) -> ExitCode {
            display.line("pickup: \(message)")
            return ExitCode(code)
        }
        var list: InputList
        var parsed = document
        if let urls {
            var seen = Set<String>()
            list = InputList(entries: urls.filter { seen.insert($0).inserted }.enumerated().map { InputList.Entry(url: $1, line: $0 + 1) })
        } else if let document {
            list = InputList(metalink: document)
        } else if metalink {
            // Read with a bound: a Metalink file over its limit is refused, not read whole.
            guard let handle = FileHandle(forReadingAtPath: inputFile) else {
                throw fail("cannot read the Metalink file \(inputFile)", Exit.usage)
            }
            defer { try? handle.close() }
            let data: Data
            do {
                data = try handle.read(upToCount: Metalink.maxBytes + 1) ?? Data()  // nil: empty
            } catch {
                throw fail("cannot read the Metalink file \(inputFile)", Exit.usage)
            }
            do {
                let doc = try Metalink.parse(Array(data))
                parsed = doc
                list = InputList(metalink: doc)
            } catch {
                throw fail("\(inputFile): \(error)", Exit.usage)
            }
        } else {
            let what = fromStandardInput ? "standard input" : "the input file \(inputFile)"
            let bytes = await Self.readList(fromStandardInput ? nil : inputFile)
            guard let bytes, let text = String(data: bytes, encoding: .utf8) else { throw fail("cannot read " + what, Exit.usage) }
            if bytes.count > Self.maxListBytes { throw fail("\(what) is over \(Self.maxListBytes >> 20) MiB: not a list of URLs", Exit.usage) }
            do {
                list = try InputList(parsing: text)
            } catch {
                throw fail("\(listName): \(error)", Exit.usage)
            }
        }
        if list.entries.isEmpty { throw fail("\(listName) lists no URL", Exit.usage) }
        // A document's hashes are never dropped in silence: a file whose hashes cannot be checked
        // is not downloaded as if it had none.
        if let f = parsed?.files.first(where: { $0.uncheckable != nil }), let why = f.uncheckable {
            throw fail("the Metalink document's \(f.name): \(why)", Exit.verification)
        }

        let cwd = FilePath(FileManager.default.currentDirectoryPath)
        var outDir = cwd.pushing(FilePath(get.dir ?? ".")).lexicallyNormalized()
        if document != nil {
            if let output = get.output {
                // `-o` names the one file the URL's document describes.
                guard list.entries.count == 1 else {
                    throw fail("\(DownloadURL.redacted(inputFile)) answered with a Metalink document of \(list.entries.count) files: "
                        + "use -d DIR instead of -o", Exit.usage)
                }
                let path = cwd.pushing(FilePath(output)).lexicallyNormalized()
                outDir = path.removingLastComponent()
                list.entries[0].name = path.lastComponent?.string
            }
            // What was given for one file applies to a document's one file; the rest says so.
            let given = get.checksum.flatMap(ExpectedDigest.init(checksumArgument:))
            if let given, list.entries.count == 1 { list.entries[0].checksum = given }
            let ignored = (given != nil && list.entries.count > 1 ? ["--checksum"] : [])
                + (get.restart ? ["--restart"] : []) + (get.urls.count > 1 ? ["the other URLs"] : [])
            if !ignored.isEmpty {
                display.line("pickup: \(ignored.joined(separator: ", ")) do not apply to the document's files (each has its own hash and URLs)")
            }
        }
        // A list is named by its path (standard input by "-"), a URL's document by the URL, -Z by its URLs.
        let listKey = urls.map { "-Z\n" + $0.joined(separator: "\n") }
            ?? (document != nil || fromStandardInput ? inputFile : cwd.pushing(FilePath(inputFile)).lexicallyNormalized().string)
        var config = DownloadManager.Configuration(
            stateDirectory: StateDirectory.default.appending("batches").appending(Self.key(listKey + "\n" + outDir.string)))
        (config.engine, config.transport) = get.engine.settings()
        if get.verbose { config.transport.trace = { display.line($0) } }
        config.engine.stateDirectory = StateDirectory.default  // completion records shared with single downloads
        config.engine.multiplex = true  // many files to a host: HTTP/2 streams of one connection where offered
        // Whole paths, as single downloads key the completion index they share (no app container moves here).
        config.pathBases = .none
        config.maxConcurrentDownloads = urls == nil ? get.jobs : 1
        config.speedLimit = get.limitRate.flatMap(Get.rate)
        config.autoStart = false
        let manager: DownloadManager
        let ids: [DownloadID]
        do {
            manager = try await DownloadManager.open(configuration: config)
            ids = try await manager.add(try list.entries.map { e in
                // A document from the network names the hosts: the user's secrets (`-H`, `-u`, netrc's
                // for the URL's host) go to the URL's origin only, and `-b` cookies are bound to it.
                var options = document == nil ? try get.http.options(for: e.url)
                    : try get.http.options(for: inputFile).named(by: inputFile, for: e.url)
                options.headers += e.headers
                return NewDownload(url: e.url, to: e.name.map { .file(outDir.appending($0)) } ?? .directory(outDir),
                                   checksum: e.checksum, overwrite: get.overwrite, options: options, mirrors: e.mirrors,
                                   pieces: e.pieces, length: e.length)
            })
        } catch {
            if let e = error as? PickupError { throw fail("\(e)", Get.code(for: e)) }
            throw fail("\(error)", Exit.usage)
        }
        let wanted = Set(ids)
        // What the list no longer names is forgotten (its partial bytes stay); what was paused goes on.
        for info in await manager.downloads() {
            if !wanted.contains(info.id) { try? await manager.cancel(info.id) }
            if info.state == .paused { try? await manager.resume(info.id) }
        }

        let signals = trap ?? SignalTrap()
        let hooks = get.hookFlags.runner()
        // A signal stops the batch and any hook running (with its process group).
        await signals.onSignal { _ in
            hooks?.stop()
            Task { await manager.shutdown() }
        }
        let started = Date()
        let events = await manager.events()
        if signals.received == nil { await manager.start() }  // (a signal already: the batch stops as it is)
        var view: [DownloadID: DownloadInfo] = [:]
        var running: [DownloadID: DownloadInfo] = [:]
        var unfinished = wanted
        var alreadyThere = 0
        var downloaded: [DownloadInfo] = []
        // For --json: what each file held when this run began, and when it started running.
        var heldAtStart: [DownloadID: Int64] = [:]
        var startedAt: [DownloadID: Date] = [:]
        func ended(_ info: DownloadInfo) {
            let completed = info.state == .completed
            let size = completed ? info.progress.totalBytes ?? info.progress.bytesDone : info.progress.totalBytes
            if get.json {
                ResultLine(path: info.path?.string, url: info.url, size: size, outcome: completed ? "downloaded" : "failed",
                           bytesTransferred: completed ? info.progress.bytesDone - (heldAtStart[info.id] ?? 0) : nil,
                           seconds: startedAt[info.id].map { Date().timeIntervalSince($0) },
                           digest: completed ? info.checksum : nil, error: info.failure?.reason).print()
            }
            hooks?.fire(HookEvent(path: info.path?.string, url: info.url, size: size, completed: completed,
                                  error: info.failure?.reason))
        }
        loop: for await event in events {
            switch event {
            case .snapshot(let all, _):
                for info in all {
                    view[info.id] = info
                    heldAtStart[info.id] = info.progress.bytesDone
                    if info.state.isFinal { unfinished.remove(info.id) }
                }
                alreadyThere = all.filter { $0.state == .completed }.count
            case .added(let info):
                view[info.id] = info
            case .changed(let info):
                let before = view[info.id]?.state
                view[info.id] = info
                if info.state == .running { running[info.id] = info } else { running[info.id] = nil }
                if info.state.isFinal { unfinished.remove(info.id) } else if wanted.contains(info.id) { unfinished.insert(info.id) }
                if before != info.state {
                    if info.state == .running, startedAt[info.id] == nil { startedAt[info.id] = Date() }
                    if info.state == .completed {
                        downloaded.append(info)
                        display.completed(info)
                    }
                    if info.state == .failed { display.failed(info) }
                    if info.state.isFinal, wanted.contains(info.id) { ended(info) }
                }
            case .progress(let id, let p):
                view[id]?.progress = p
                running[id]?.progress = p
            case .totals(let totals):
                display.draw(totals: totals, running: running.values.sorted { $0.id < $1.id }, of: ids.count)
            case .notice(let id, let text):
                if let info = view[id] { display.notice(info, text) }
            case .removed(let id):
                view[id] = nil
            }
            if unfinished.isEmpty { break loop }
        }
        await manager.shutdown()
        await hooks?.drain()
        display.clear()
        if let sig = signals.received {
            display.line("pickup: interrupted; the batch is kept. Run the same command again to resume it.")
            throw ExitCode(sig == SIGTERM ? Exit.terminated : Exit.interrupted)
        }
        let failures = ids.compactMap { view[$0] }.filter { $0.state == .failed }
        display.summary(downloaded: downloaded, alreadyThere: alreadyThere, failures: failures,
                        elapsed: Date().timeIntervalSince(started))
        guard failures.isEmpty else {
            // One kind of failure gives its own exit code; several kinds give 1.
            let kinds = Set(failures.compactMap { $0.failure?.category })
            throw ExitCode(kinds.count == 1 ? Get.code(for: kinds.first!) : Exit.failure)
        }
    }

    /// The longest list of URLs read (`-i`): a larger input is refused.
    static let maxListBytes = 64 << 20

    /// The list's bytes (standard input when `path` is nil), at most ``maxListBytes`` + 1 of them,
    /// read on a Dispatch thread: the read blocks as long as whoever writes standard input takes,
    /// which must not hold a thread of Swift's cooperative pool. Nil when it cannot be read.
    static func readList(_ path: String?) async -> Data? {
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                guard let handle = path == nil ? FileHandle.standardInput : FileHandle(forReadingAtPath: path!) else {
                    return continuation.resume(returning: nil)
                }
                do {
                    continuation.resume(returning: try handle.read(upToCount: maxListBytes + 1) ?? Data())  // (nil: empty)
                } catch {
                    continuation.resume(returning: nil)
                }
            }
        }
    }

    /// A short stable name for a (list, directory) pair: FNV-1a, 64 bits, in hex.
    static func key(_ s: String) -> String {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in s.utf8 {
            h ^= UInt64(b)
            h = h &* 0x100_0000_01b3
        }
        return String(h, radix: 16)
    }
}

/// Progress of a batch on standard error: on a terminal, an overall line and one line per running
/// download, redrawn in place; on a pipe, a line per finished file and an overall line every few seconds.
final class BatchDisplay: @unchecked Sendable {
    private let lock = NSLock()
    private let quiet: Bool
    private let tty: Bool
    private var drawnLines = 0
    private var lastPlain = Date.distantPast

    init(quiet: Bool) {
        self.quiet = quiet
        tty = isatty(STDERR_FILENO) != 0
    }

    func draw(totals t: ManagerTotals, running: [DownloadInfo], of count: Int) {
        guard !quiet else { return }
        var overall = "\(t.count(.completed))/\(count) done  " + (running.isEmpty ? "" : "\(running.count) active  ") + ByteCount.format(t.bytesDone)
        if t.totalBytes > 0 { overall += " / " + ByteCount.format(t.totalBytes) }
        if let f = t.fraction { overall += "  " + ProgressText.percent(f) }
        overall += "  " + ByteCount.format(Int64(t.bytesPerSecond)) + "/s"
        if let left = t.secondsLeft { overall += "  " + ProgressText.duration(left) + " left" }
        if t.count(.failed) > 0 { overall += "  \(t.count(.failed)) failed" }
        if tty {
            // Each line fits the terminal's width, and the lines its height.
            let width = ProgressDisplay.width(tty: true)
            let shown = running.prefix(max(0, min(16, ProgressDisplay.rows() - 2)))
            let lines = [String(overall.prefix(width - 1))]
                + shown.map { "  " + ProgressText.line(name: Self.name($0), progress: $0.progress, width: width - 2) }
            lock.withLock {
                clearDrawn()
                write(lines.joined(separator: "\n"))
                drawnLines = lines.count
            }
        } else if Date().timeIntervalSince(lastPlain) >= 5 {
            lastPlain = Date()
            lock.withLock { write(overall + "\n") }
        }
    }

    func completed(_ info: DownloadInfo) {
        guard !quiet else { return }
        line("saved \(info.path?.string ?? DownloadURL.redacted(info.url)) (\(ByteCount.format(info.progress.bytesDone)))")
    }

    func failed(_ info: DownloadInfo) {
        line("pickup: \(DownloadURL.redacted(info.url)): \(info.failure?.reason ?? "failed")")
    }

    func notice(_ info: DownloadInfo, _ text: String) {
        guard !quiet else { return }
        line("pickup: \(Self.name(info)): \(text)")
    }

    func summary(downloaded: [DownloadInfo], alreadyThere: Int, failures: [DownloadInfo], elapsed: Double) {
        let bytes = downloaded.reduce(Int64(0)) { $0 + $1.progress.bytesDone }
        if !quiet || !failures.isEmpty {
            var text = "\(downloaded.count) downloaded (\(ByteCount.format(bytes))) in \(String(format: "%.1f", elapsed)) s"
            if alreadyThere > 0 { text += ", \(alreadyThere) already there" }
            if !failures.isEmpty { text += ", \(failures.count) failed:" }
            line(text)
        }
        for f in failures { line("  \(DownloadURL.redacted(f.url)): \(f.failure?.reason ?? "failed")") }
    }

    static func name(_ info: DownloadInfo) -> String {
        if case .file(let p) = info.destination { return p.lastComponent?.string ?? info.url }
        return ProgressDisplay.name(of: info.url) ?? DownloadURL.redacted(info.url)
    }

    /// A line of its own (from any thread: `-v`'s heads come from the connections' threads).
    func line(_ text: String) {
        lock.withLock {
            clearDrawn()
            write(text + "\n")
        }
    }

    func clear() { lock.withLock { clearDrawn() } }

    /// Clears what the last draw drew. Called with `lock` held.
    private func clearDrawn() {
        guard drawnLines > 0 else { return }
        write("\r" + String(repeating: "\u{1B}[1A", count: drawnLines - 1) + "\u{1B}[J")
        drawnLines = 0
    }

    private func write(_ s: String) {
        FileHandle.standardError.write(Data(s.utf8))
    }
}
