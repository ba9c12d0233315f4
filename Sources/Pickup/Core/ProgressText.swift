import CPickupShims
import Foundation

/// A download's progress as one line of text that fits a given width (a terminal's columns):
/// the file's name, a bar, bytes, percent, speed, time left, connections and a slow server's
/// wait, the least needed left out first when they do not all fit.
public enum ProgressText {
    /// The line for `progress` of the file `name`, at most `width - 1` characters (a line that
    /// fills the last column wraps on some terminals). Bytes always; then, while there is room,
    /// speed, the name (shortened in the middle, keeping its extension), percent, time left, a slow
    /// server's wait, connections, and a bar.
    public static func line(name: String?, progress p: DownloadProgress, width: Int) -> String {
        let room = max(20, min(width, 1000)) - 1
        // Each part with its rank: the lower, the sooner it is left out. The name counts for its
        // shortest form (10 characters) and takes what is left once the others fit.
        let named = name.map { !$0.isEmpty } ?? false
        var parts: [(rank: Int, text: String)] = []
        var bytes = ByteCount.format(max(0, p.bytesDone))
        if let total = p.totalBytes { bytes += "/" + ByteCount.format(max(0, total)) }
        if named { parts.append((8, String(repeating: " ", count: 10))) }
        parts.append((10, bytes))
        if let f = p.fraction { parts.append((7, percent(f))) }
        let speed = p.bytesPerSecond.isNaN ? 0 : min(max(p.bytesPerSecond, 0), 1e18)
        parts.append((9, ByteCount.format(Int64(speed)) + "/s"))
        if let left = p.secondsLeft { parts.append((6, duration(left) + " left")) }
        if p.connections > 1 { parts.append((4, "\(min(p.connections, 999)) conn")) }
        if let wait = p.stallTimeout { parts.append((5, "slow server: waiting up to \(duration(wait)) for data")) }
        func length(_ ps: [(rank: Int, text: String)]) -> Int {
            ps.reduce(0) { $0 + $1.text.count } + 2 * max(0, ps.count - 1)
        }
        while length(parts) > room, parts.count > 1, let lowest = parts.indices.min(by: { parts[$0].rank < parts[$1].rank }) {
            parts.remove(at: lowest)
        }
        let hasName = parts.first?.rank == 8
        var rest = (hasName ? parts.dropFirst() : parts[...]).map(\.text).joined(separator: "  ")
        if rest.count > room { return String(rest.prefix(room)) }
        // A bar before the bytes, when the fraction is known and 14 columns are left beyond the name's 10.
        let spare = room - rest.count - (hasName ? 12 : 0) - 2
        if let f = p.fraction, spare >= 12 {
            let inner = min(spare, 32) - 2
            let filled = Int((Double(inner) * min(1, max(0, f))).rounded(.down))
            rest = "[" + String(repeating: "#", count: filled) + String(repeating: " ", count: inner - filled) + "]  " + rest
        }
        guard hasName, let name else { return rest }
        return shortened(name, to: min(room - rest.count - 2, 40)) + "  " + rest
    }

    /// `name` in at most `limit` characters: its start, `…` and its last characters (the extension kept).
    public static func shortened(_ name: String, to limit: Int) -> String {
        let clean = Trace.printable(name, limit: 4096)
        guard clean.count > limit, limit >= 3 else { return String(clean.prefix(max(0, limit))) }
        let tail = min(clean.count, max(1, (limit - 1) / 2))
        return String(clean.prefix(limit - 1 - tail)) + "…" + String(clean.suffix(tail))
    }

    /// ` 12.5%`.
    public static func percent(_ fraction: Double) -> String {
        let f = fraction.isNaN ? 0 : min(1, max(0, fraction))
        return String(format: "%.1f%%", f * 100)
    }

    /// `42s`, `3m05s`, `2h07m`.
    public static func duration(_ s: Double) -> String {
        let t = Int(Seconds.clamped(s).rounded())
        if t >= 3600 { return "\(t / 3600)h" + pad(t % 3600 / 60) + "m" }
        if t >= 60 { return "\(t / 60)m" + pad(t % 60) + "s" }
        return "\(t)s"
    }

    private static func pad(_ n: Int) -> String { n < 10 ? "0\(n)" : "\(n)" }
}

/// The terminal a stream is on.
public enum Terminal {
    /// The columns and rows of the terminal at `fd` (asked each time: a window can be resized);
    /// nil when `fd` is not a terminal or it says 0.
    public static func size(of fd: Int32) -> (columns: Int, rows: Int)? {
        var columns: Int32 = 0
        var rows: Int32 = 0
        guard pickup_terminal_size(fd, &columns, &rows) == 0, columns > 0 else { return nil }
        return (Int(columns), Int(max(rows, 1)))
    }
}
