import ArgumentParser
import Foundation
import Pickup

/// Exit codes, documented in the README.
enum Exit {
    static let success: Int32 = 0
    static let failure: Int32 = 1
    static let usage: Int32 = 2
    static let network: Int32 = 3
    static let server: Int32 = 4
    static let verification: Int32 = 5
    static let fileSystem: Int32 = 6
    static let interrupted: Int32 = 130
    static let terminated: Int32 = 143
}

struct PickupCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pickup",
        abstract: "Resumable, crash-safe downloads.",
        discussion: "Run the same command again after any interruption and the download picks up where it left off.",
        version: PickupVersion.string,
        subcommands: [Get.self, Serve.self, Add.self, List.self, SetCommand.self, Pause.self, Resume.self, Remove.self, Watch.self, Partials.self, Clean.self])
}

/// ArgumentParser validates a command before it looks for unknown options: `--tries 3 URL` took
/// `3` for a URL and blamed it. Behind a validation error, the arguments are parsed again with the
/// validations passing, so that an unknown option (or another parse error) is what is said.
enum Validation {
    /// While true, every `validate()` of the CLI passes (set only by `parseError(behind:)`, on the
    /// main thread, before anything else runs).
    nonisolated(unsafe) static var skipped = false

    /// The error to report for a failed parse: ArgumentParser's own when the arguments parse
    /// without the validations (an unknown option, a missing value), else `original`.
    static func parseError(behind original: any Error, arguments: [String]) -> any Error {
        skipped = true
        defer { skipped = false }
        do {
            _ = try PickupCommand.parseAsRoot(arguments)
            return original
        } catch {
            return error
        }
    }
}

@main
enum Main {
    static func main() async {
        var command: ParsableCommand
        // `get`'s default options from the config file go first: the command line's win.
        let arguments: [String]
        do {
            arguments = try ConfigFile.expand(Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment)
        } catch {
            FileHandle.standardError.write(Data("pickup: \(error)\n".utf8))
            exit(Exit.usage)
        }
        do {
            command = try PickupCommand.parseAsRoot(arguments)
        } catch {
            let error = Validation.parseError(behind: error, arguments: arguments)
            let code = PickupCommand.exitCode(for: error)
            if code == .success {
                print(PickupCommand.fullMessage(for: error))
                exit(Exit.success)
            }
            FileHandle.standardError.write(Data("pickup: \(PickupCommand.message(for: error))\n".utf8))
            FileHandle.standardError.write(Data("Run 'pickup --help' for usage.\n".utf8))
            exit(Exit.usage)
        }
        // Parsed: the secrets in the argument strings are no longer needed there.
        ArgumentScrubber.scrub()
        do {
            if var async = command as? AsyncParsableCommand {
                try await async.run()
            } else {
                try command.run()
            }
            exit(Exit.success)
        } catch let e as ExitCode {
            exit(e.rawValue)
        } catch {
            let code = PickupCommand.exitCode(for: error)
            if code == .success {
                print(PickupCommand.fullMessage(for: error))
                exit(Exit.success)
            }
            FileHandle.standardError.write(Data("pickup: \(PickupCommand.message(for: error))\n".utf8))
            exit(Exit.usage)
        }
    }
}
