import Foundation
import Pickup
import PickupBackground
import SystemPackage

// pickup-handoff-probe STATE_DIR CHUNK_SIZE
//
// An app gone to the background, as a process of its own for the hand-off crash test
// (HandOffCrashTests), which kills it with SIGKILL at random moments: opens the manager of
// STATE_DIR without starting it, hands its waiting downloads to background transfers in chunks of
// CHUNK_SIZE bytes, waits until every chunk has landed or been refused, and says so on standard
// output. Exit 2 for bad arguments, 3 when the manager cannot be opened.
let arguments = CommandLine.arguments
guard arguments.count == 3, let chunkSize = Int64(arguments[2]), chunkSize > 0 else {
    FileHandle.standardError.write(Data("usage: pickup-handoff-probe STATE_DIR CHUNK_SIZE\n".utf8))
    exit(2)
}
var configuration = DownloadManager.Configuration(stateDirectory: FilePath(arguments[1]))
configuration.autoStart = false
configuration.engine.stateDirectory = FilePath(arguments[1])
let manager: DownloadManager
do {
    manager = try DownloadManager(configuration: configuration)
} catch {
    FileHandle.standardError.write(Data("cannot open the manager: \(error)\n".utf8))
    exit(3)
}
let transfers = BackgroundTransfers(manager: manager, identifier: "pickup-handoff-probe")
let chunks = await transfers.enterBackground(chunkSize: chunkSize)
print("started \(chunks.count)")
await transfers.finished()
let landed = transfers.landings.values.filter { if case .landed = $0 { true } else { false } }.count
print("landed \(landed) of \(chunks.count)")
transfers.invalidate()
await manager.shutdown()
