import Foundation
import Pickup

/// Progress on standard error: one line redrawn at most ten times a second on a terminal, fitting
/// its width (asked at each redraw), a plain line every few seconds on a pipe, nothing with --quiet.
final class ProgressDisplay: @unchecked Sendable {
    private let lock = NSLock()
    private let quiet: Bool
    private let tty: Bool
    private let name: String?
    private var lastDraw = 0.0
    private var drawn = false
    private let started = Date()

    /// `name`: the file's, as far as it is known before the server names it.
    init(quiet: Bool, name: String? = nil) {
        self.quiet = quiet
        self.name = name
        self.tty = isatty(STDERR_FILENO) != 0
    }

    /// Columns of standard error's terminal (COLUMNS, then 80, when it does not say); a pipe has
    /// room for every part.
    static func width(tty: Bool) -> Int {
        guard tty else { return 400 }
        return Terminal.size(of: STDERR_FILENO)?.columns
            ?? ProcessInfo.processInfo.environment["COLUMNS"].flatMap(Int.init).map { min(max($0, 20), 1000) } ?? 80
    }

    /// The rows of standard error's terminal (24 when it does not say).
    static func rows() -> Int { Terminal.size(of: STDERR_FILENO)?.rows ?? 24 }

    /// A name for the progress line from a URL: its last path segment, if any.
    static func name(of url: String) -> String? {
        guard let path = URLComponents(string: url)?.path, let last = path.split(separator: "/").last else { return nil }
        return String(last).removingPercentEncoding ?? String(last)
    }

    func handle(_ event: DownloadEvent) {
        guard !quiet else { return }
        switch event {
        case .notice(let text):
            // Extra URLs are mirrors of one file (aria2c's convention): one that is another file says how to get each.
            let hint = text.contains(DownloadEvent.notTheSameFile) ? "; use -Z to download each URL as its own file" : ""
            line("pickup: \(text)\(hint)")
        case .progress(let p):
            // Nothing has answered yet (connecting, or retrying a refused connection, whose
            // notices say so): a line of zeros would say nothing.
            if p.bytesDone == 0, p.totalBytes == nil, p.stallTimeout == nil { return }
            lock.withLock {
                let now = Date().timeIntervalSince(started)
                let interval = tty ? 0.1 : 5
                guard now - lastDraw >= interval else { return }
                lastDraw = now
                let text = ProgressText.line(name: name, progress: p, width: Self.width(tty: tty))
                if tty {
                    write("\r\u{1B}[K" + text)
                    drawn = true
                } else {
                    write(text + "\n")
                }
            }
        }
    }

    /// A line of its own (errors always; notices unless quiet), clearing the progress line first.
    func line(_ text: String) {
        lock.withLock {
            if drawn { write("\r\u{1B}[K") }
            drawn = false
            write(text + "\n")
        }
    }

    func clear() {
        lock.withLock {
            if drawn { write("\r\u{1B}[K") }
            drawn = false
        }
    }

    func finished(_ r: DownloadResult) {
        guard !quiet else { return }
        switch r.outcome {
        case .unchanged, .metalink:
            break  // (the download's notice said it; a Metalink document's files are a batch, which speaks for itself)
        case .downloaded:
            let speed = r.elapsed > 0 ? Double(r.bytesTransferred) / r.elapsed : 0
            var text = "saved \(r.path) (\(ByteCount.format(r.size))) in \(String(format: "%.1f", r.elapsed)) s, \(ByteCount.format(Int64(speed)))/s average"
            if r.resumedFrom > 0 { text += ", resumed from \(ByteCount.format(r.resumedFrom))" }
            line(text)
        }
    }

    private func write(_ s: String) {
        FileHandle.standardError.write(Data(s.utf8))
    }
}
