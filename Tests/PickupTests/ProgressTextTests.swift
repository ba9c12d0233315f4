import Foundation
import Testing

@testable import Pickup

/// The progress line fits the terminal: whatever the numbers and the name, never wider than the
/// width less one, with the bytes always there and the other parts in order of need.
@Suite struct ProgressTextTests {
    @Test func everyLineFitsItsWidthWhateverTheNumbersAndTheName() {
        var rng = SplitMix(state: propertySeed("PICKUP_PROGRESS_SEED", "everyLineFitsItsWidthWhateverTheNumbersAndTheName"))
        let names = ["", "a.iso", "ubuntu-24.04.1-desktop-amd64.iso", String(repeating: "長い名前", count: 40), "new\nline\tand tab.bin",
                     "🙂🙂🙂.tar.gz", String(repeating: "x", count: 300)]
        let numbers: [Int64] = [0, 1, 1023, 1 << 20, 5 << 30, Int64.max / 2, Int64.max, -5]
        let speeds: [Double] = [0, 1, 1e6, 1e12, .infinity, .nan, -1, Double.greatestFiniteMagnitude]
        for _ in 0..<3000 {
            var p = DownloadProgress(bytesDone: numbers.randomElement(using: &rng)!,
                                     totalBytes: Bool.random(using: &rng) ? numbers.randomElement(using: &rng)! : nil,
                                     bytesPerSecond: speeds.randomElement(using: &rng)!,
                                     stallTimeout: Bool.random(using: &rng) ? [0, 30, 1e9, .nan].randomElement(using: &rng)! : nil,
                                     connections: Int.random(in: -3...5000, using: &rng))
            if Bool.random(using: &rng) { p.bytesDone = Int64.random(in: 0...(1 << 40), using: &rng) }
            let width = Int.random(in: -10...300, using: &rng)
            let name = Bool.random(using: &rng) ? names.randomElement(using: &rng)! : nil
            let line = ProgressText.line(name: name, progress: p, width: width)
            #expect(line.count <= max(20, min(width, 1000)) - 1, "\(width): \(line)")
            #expect(!line.contains("\n") && !line.contains("\t"), "\(line)")
        }
    }

    @Test func wideShowsEverythingAndNarrowKeepsWhatMattersMost() {
        let p = DownloadProgress(bytesDone: 3 << 30, totalBytes: 4 << 30, bytesPerSecond: Double(12 << 20), connections: 8)
        let wide = ProgressText.line(name: "ubuntu-24.04.1-desktop-amd64.iso", progress: p, width: 160)
        #expect(wide.hasPrefix("ubuntu-24.04.1-desktop-amd64.iso  ["), "\(wide)")
        for part in ["3.0 GiB/4.0 GiB", "75.0%", "12.0 MiB/s", "1m25s left", "8 conn", "#"] { #expect(wide.contains(part), "\(wide)") }
        // 40 columns: no bar, connections, time left or percent, but the name shortened, the bytes and the speed.
        let narrow = ProgressText.line(name: "ubuntu-24.04.1-desktop-amd64.iso", progress: p, width: 40)
        #expect(narrow.count <= 39 && !narrow.contains("[") && !narrow.contains("conn") && !narrow.contains("left"), "\(narrow)")
        for part in ["ubunt", "…", "3.0 GiB/4.0 GiB", "12.0 MiB/s"] { #expect(narrow.contains(part), "\(narrow)") }
        // 60: the percent and the time left come back.
        let middle = ProgressText.line(name: "ubuntu-24.04.1-desktop-amd64.iso", progress: p, width: 60)
        #expect(middle.count <= 59 && middle.contains("75.0%") && middle.contains("left"), "\(middle)")
        // A name too long for what is left keeps its start and its extension.
        #expect(ProgressText.shortened("ubuntu-24.04.1-desktop-amd64.iso", to: 15) == "ubuntu-…d64.iso")
        // A slow server's wait is named.
        let slow = DownloadProgress(bytesDone: 10, totalBytes: nil, bytesPerSecond: 0, stallTimeout: 60)
        #expect(ProgressText.line(name: nil, progress: slow, width: 100).contains("slow server: waiting up to 1m00s for data"))
    }
}

/// `-v`'s heads: secrets in fields, URLs and query strings never shown, control characters replaced.
@Suite struct TraceTests {
    @Test func secretsAreRedactedWhereverTheyAre() {
        let url = "https://bob:hunter2@bucket.s3.example/f.iso?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=abc123&part=2&access_token=t0k#frag"
        let shown = Trace.url(url)
        #expect(!shown.contains("hunter2") && !shown.contains("bob") && !shown.contains("abc123") && !shown.contains("AKIA")
                && !shown.contains("t0k"), "\(shown)")
        #expect(shown.contains("part=2") && shown.contains("X-Amz-Signature=[redacted]") && shown.hasSuffix("#frag"), "\(shown)")
        #expect(!Trace.field("Location", "//carol:pw@cdn.example/x?sig=s3cr3t").contains("pw"))
        #expect(!Trace.field("Location", "//carol:pw@cdn.example/x?sig=s3cr3t").contains("s3cr3t"))
        #expect(Trace.field("X-Goog-Signature", "zzz") == "X-Goog-Signature: [redacted]")
        #expect(Trace.field("Set-Cookie", "sid=1") == "Set-Cookie: [redacted]")
        #expect(Trace.field("Content-Type", "a\u{1B}[31mb") == "Content-Type: a?[31mb")
        #expect(Trace.field("Content-Length", "5") == "Content-Length: 5")
    }
}
