import ArgumentParser
import Foundation
import Pickup
import SystemPackage

/// `pickup partials [DIR]`: the unfinished downloads a directory holds (their helper files are
/// hidden while the server has not named the file yet, and `ls` does not show them).
struct Partials: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "partials",
        abstract: "List the unfinished downloads in a directory (default: the current one).",
        discussion: "Each with its name, what it holds, its URL (without credentials) and its helper files. "
            + "Run the command that started one again to resume it; `pickup clean` removes them.")

    @Argument(help: ArgumentHelp("The directory.", valueName: "dir")) var dir: String = "."

    @Flag(help: "One JSON object per download on standard output.") var json = false

    func run() throws {
        let found = try UnfinishedList.read(dir)
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            for d in found {
                let line = UnfinishedList.Line(name: d.name, url: d.url, files: d.files, bytesHeld: d.bytesHeld, totalBytes: d.totalBytes,
                                               diskBytes: d.diskBytes, inUse: d.inUse)
                FileHandle.standardOutput.write(((try? encoder.encode(line)) ?? Data("{}".utf8)) + Data("\n".utf8))
            }
            return
        }
        if found.isEmpty { return print("no unfinished downloads in \(dir)") }
        for d in found { print(UnfinishedList.describe(d)) }
        let total = found.reduce(Int64(0)) { $0 + $1.diskBytes }
        print("\(found.count) unfinished download\(found.count == 1 ? "" : "s"), \(ByteCount.format(total)) on disk")
    }
}

/// `pickup clean [DIR]`: removes the unfinished downloads in a directory, having said which.
struct Clean: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "clean",
        abstract: "Remove the unfinished downloads in a directory (default: the current one), having listed them.",
        discussion: "Only pickup's helper files (NAME.pickup-part, .pickup-ctl, .pickup-pos) are removed, never a finished file, "
            + "and none a running download holds. On a terminal it asks first; elsewhere give --yes.")

    @Argument(help: ArgumentHelp("The directory.", valueName: "dir")) var dir: String = "."

    @Flag(name: [.short, .long], help: "Remove without asking.") var yes = false

    func run() throws {
        let found = try UnfinishedList.read(dir)
        if found.isEmpty { return print("no unfinished downloads in \(dir)") }
        for d in found { print(UnfinishedList.describe(d)) }
        let removable = found.filter { !$0.inUse }
        let total = removable.reduce(Int64(0)) { $0 + $1.diskBytes }
        guard !removable.isEmpty else { return print("nothing removed: every one is being downloaded") }
        let what = "\(removable.count) unfinished download\(removable.count == 1 ? "" : "s") (\(ByteCount.format(total)))"
        if !yes {
            guard isatty(STDIN_FILENO) != 0 else {
                FileHandle.standardError.write(Data("pickup: would remove \(what); add --yes to remove them\n".utf8))
                throw ExitCode(Exit.usage)
            }
            FileHandle.standardError.write(Data("Remove \(what)? Their bytes are lost. [y/N] ".utf8))
            guard let answer = readLine(strippingNewline: true)?.lowercased(), answer == "y" || answer == "yes" else {
                return print("nothing removed")
            }
        }
        var removed = 0, bytes: Int64 = 0
        for d in removable {
            do {
                if try UnfinishedDownloads.remove(d, in: FilePath(dir)) {
                    removed += 1
                    bytes += d.diskBytes
                } else {
                    print("kept \(UnfinishedList.title(d)): a download of it started meanwhile")
                }
            } catch {
                throw UnfinishedList.failure(error, dir)
            }
        }
        print("removed \(removed) unfinished download\(removed == 1 ? "" : "s"), \(ByteCount.format(bytes))")
    }
}

/// What `partials` and `clean` share: reading a directory and saying what is in it.
enum UnfinishedList {
    static func read(_ dir: String) throws -> [UnfinishedDownload] {
        do {
            return try UnfinishedDownloads.list(in: FilePath(dir))
        } catch {
            throw failure(error, dir)
        }
    }

    static func failure(_ error: PickupError, _ dir: String) -> ExitCode {
        FileHandle.standardError.write(Data("pickup: \(error)\n".utf8))
        return ExitCode(Get.code(for: error))
    }

    static func title(_ d: UnfinishedDownload) -> String {
        Trace.printable(d.name ?? "(not named yet)", limit: 200)
    }

    /// `name  held/total (percent)  URL  [in use]` and its helper files.
    static func describe(_ d: UnfinishedDownload) -> String {
        var held = ByteCount.format(d.bytesHeld)
        if let total = d.totalBytes, total > 0 {
            held += "/" + ByteCount.format(total) + " (" + ProgressText.percent(Double(d.bytesHeld) / Double(total)) + ")"
        }
        var line = title(d) + "  " + held + "  " + Trace.printable(d.url ?? "(no control file: cannot be resumed)", limit: 500)
        if d.inUse { line += "  [being downloaded]" }
        return line + "\n    " + d.files.map { Trace.printable($0, limit: 300) }.joined(separator: " ")
    }

    /// `partials --json`: one object per download.
    struct Line: Encodable {
        var name: String?
        var url: String?
        var files: [String]
        var bytesHeld: Int64
        var totalBytes: Int64?
        var diskBytes: Int64
        var inUse: Bool
    }
}
