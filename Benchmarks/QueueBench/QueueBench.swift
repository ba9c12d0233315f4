// 10,000 queued downloads: how long adding, listing, observing and restoring them take.
// Run by Benchmarks/bench.py (case "queue"), or: swift build -c release && .build/release/pickup-queue-bench
import Foundation
import Pickup
import SystemPackage

@main
enum QueueBench {
    static func time<T: Sendable>(_ f: @Sendable () async throws -> T) async rethrows -> (T, Double) {
        let start = ContinuousClock.now
        let value = try await f()
        let d = ContinuousClock.now - start
        return (value, Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18)
    }

    static func main() async throws {
        let count = CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 10_000 : 10_000
        let root = FilePath(NSTemporaryDirectory()).appending("pickup-queue-bench-\(getpid())")
        defer { try? FileManager.default.removeItem(atPath: root.string) }
        @Sendable func config(_ name: String) -> DownloadManager.Configuration {
            var c = DownloadManager.Configuration(stateDirectory: root.appending(name))
            c.autoStart = false
            return c
        }
        let urls = (0..<count).map { "https://example.com/files/\($0).bin" }
        let dest = Destination.directory(root.appending("out"))

        let one = try DownloadManager(configuration: config("one"))
        let (_, addOne) = try await time { for u in urls { try await one.add(u, to: dest) } }
        await one.shutdown()

        let many = try DownloadManager(configuration: config("many"))
        let (_, addMany) = try await time { try await many.add(urls.map { NewDownload(url: $0, to: dest) }) }
        let (_, again) = try await time { try await many.add(urls.map { NewDownload(url: $0, to: dest) }) }
        let (all, listAll) = await time { await many.downloads() }
        let (waiting, listWaiting) = await time { await many.downloads(in: .waiting) }
        let (_, lookup) = await time { await many.downloads(url: urls[count / 2]) }
        let (_, snapshot) = await time { () async -> Int in
            for await event in await many.events() {
                if case .snapshot(let s, _) = event { return s.count }
            }
            return 0
        }
        await many.shutdown()
        let again2 = config("many")
        let (restored, restore) = try await time { try DownloadManager(configuration: again2) }
        let restoredCount = await restored.downloads().count
        await restored.shutdown()
        precondition(all.count == count && waiting.count == count && restoredCount == count)

        func ms(_ s: Double) -> String { String(format: "%.0f ms", s * 1000) }
        print("| operation on \(count) downloads | time |")
        print("| --- | --- |")
        print("| add one at a time (\(count) calls, a transaction each) | \(ms(addOne)) |")
        print("| add all in one call (one transaction) | \(ms(addMany)) |")
        print("| add all again (all duplicates) | \(ms(again)) |")
        print("| list all | \(ms(listAll)) |")
        print("| list waiting, in start order | \(ms(listWaiting)) |")
        print("| find by URL | \(ms(lookup)) |")
        print("| subscribe to events (snapshot of all) | \(ms(snapshot)) |")
        print("| restore: a new manager on the same state | \(ms(restore)) |")
    }
}
