// The README's library examples, as a program: `consumer URL DIR` downloads URL into DIR with a
// Downloader, then again through a DownloadManager, and prints what each saved.
import Foundation
import Pickup
import PickupBackground

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

let arguments = CommandLine.arguments
guard arguments.count == 3, let url = URL(string: arguments[1]) else {
    print("usage: consumer URL DIR")
    exit(2)
}
let dir = URL(fileURLWithPath: arguments[2], isDirectory: true)

// One file.
let downloader = Downloader()
let result = try await downloader.download(
    DownloadRequest(url: url, destination: .directory(at: dir))
) { event in
    switch event {
    case .progress(let p): _ = (p.bytesDone, p.totalBytes, p.bytesPerSecond, p.secondsLeft)
    case .notice(let text): print(text)
    }
}
print("saved", result.fileURL.path, result.size)
await downloader.shutdown()

// Many files: a manager that survives restarts.
var config = DownloadManager.Configuration(stateDirectory: dir.appendingPathComponent(".state"))
config.maxConcurrentDownloads = 3
let manager = try DownloadManager(configuration: config)
let id = try await manager.add(url, to: .file(at: dir.appendingPathComponent("copy.bin")))
guard let info = await manager.outcome(of: id), info.state == .completed, let path = info.fileURL?.path else {
    print("the managed download did not complete")
    exit(1)
}
print("managed", path, info.progress.bytesDone)

// The app goes to the background and comes back: what is missing (nothing here) would go on in
// background transfers meanwhile.
let transfers = BackgroundTransfers(manager: manager)
let handed = await transfers.enterBackground()
print("background chunks", handed.count)
_ = await transfers.enterForeground()
transfers.invalidate()
await manager.shutdown()

