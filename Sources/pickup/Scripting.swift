import ArgumentParser
import Foundation
import Pickup
import PickupDaemon

/// `--on-complete`, `--on-error`, `--hook-timeout`: for `get`, `get -i` and `serve`.
struct HookFlags: ParsableArguments {
    @Option(help: ArgumentHelp(
        "Run this program when a download completes: no shell; the file's path is its first argument and "
            + "PICKUP_PATH, PICKUP_URL, PICKUP_SIZE and PICKUP_OUTCOME are in its environment.",
        valueName: "program"))
    var onComplete: String?

    @Option(help: ArgumentHelp("Run this program when a download fails (as --on-complete; PICKUP_ERROR says why).",
                               valueName: "program"))
    var onError: String?

    @Option(help: ArgumentHelp("Seconds a hook may run before it is stopped.", valueName: "seconds"))
    var hookTimeout: Double = 60

    func validate() throws {
        guard !Validation.skipped else { return }
        guard Seconds.isValid(hookTimeout) else { throw ValidationError("--hook-timeout must be a number of seconds above 0, at most 86400") }
        for program in [onComplete, onError].compactMap({ $0 }) where HookRunner.resolve(program) == nil {
            throw ValidationError("hook program '\(program)' not found")
        }
    }

    var hooks: Hooks { Hooks(onComplete: onComplete, onError: onError, timeout: hookTimeout) }

    /// A runner that reports failing hooks on standard error; nil when no hook is set.
    func runner() -> HookRunner? {
        hooks.isEmpty ? nil : HookRunner(hooks: hooks) { FileHandle.standardError.write(Data("pickup: \($0)\n".utf8)) }
    }
}

/// One line of `--json` output: a finished (or failed) file, as one JSON object.
struct ResultLine {
    var path: String?
    var url: String
    var size: Int64?
    /// `downloaded`, `unchanged` or `failed`.
    var outcome: String
    var bytesTransferred: Int64?
    var seconds: Double?
    var digest: ExpectedDigest?
    var error: String?

    var json: String {
        var object: [String: Any] = ["url": DownloadURL.redacted(url), "outcome": outcome]
        object["path"] = path ?? NSNull()
        object["size"] = size.map { NSNumber(value: $0) } ?? NSNull()
        if let bytesTransferred { object["bytesTransferred"] = NSNumber(value: bytesTransferred) }
        if let seconds { object["seconds"] = NSNumber(value: (seconds * 1000).rounded() / 1000) }
        if let digest { object["digest"] = "\(digest.algorithm.rawValue)=\(digest.hex)" }
        if let error { object["error"] = error }
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data("{}".utf8)
        return String(decoding: data, as: UTF8.self)
    }

    /// Prints the line on standard output at once (a script may be reading as files finish).
    func print() {
        FileHandle.standardOutput.write(Data((json + "\n").utf8))
    }
}
