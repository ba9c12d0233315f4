import Foundation
import Pickup
import SystemPackage

/// The daemon's files in its state directory: `token` (mode 0600), `daemon.json` (the address
/// while it runs, for the CLI client) and `settings.json` (what `PATCH /settings` changed).
public struct DaemonFiles: Sendable {
    /// The state directory.
    public let directory: FilePath

    /// The files of the daemon whose state is in `directory`.
    public init(directory: FilePath) { self.directory = directory }

    var tokenPath: FilePath { directory.appending("token") }
    var addressPath: FilePath { directory.appending("daemon.json") }
    var settingsPath: FilePath { directory.appending("settings.json") }

    struct Address: Codable { var url: String; var pid: Int32 }

    /// The token, made (32 random bytes, hex) and saved readable by the owner only on first use.
    func token() throws(PickupError) -> (String, isNew: Bool) {
        if let existing = readToken() {
            // Someone loosened the mode: tighten it again, the token is a password.
            _ = try? FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: tokenPath.string)
            return (existing, false)
        }
        var rng = SystemRandomNumberGenerator()
        let token = (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &rng)) }.joined()
        do {
            let fd = try FileDescriptor.open(tokenPath, .writeOnly, options: [.create, .exclusiveCreate],
                                             permissions: [.ownerReadWrite])
            try fd.closeAfter { _ = try fd.writeAll(Array((token + "\n").utf8)) }
        } catch {
            throw .fileSystem("cannot write the token to \(tokenPath): \(error)", .ioError)
        }
        return (token, true)
    }

    /// The saved token, if any.
    public func readToken() -> String? {
        guard let data = FileManager.default.contents(atPath: tokenPath.string),
            let text = String(data: data, encoding: .utf8)?.trimmingCharacters(in: .whitespacesAndNewlines), !text.isEmpty
        else { return nil }
        return text
    }

    /// The running daemon's base URL, if one has written it.
    public func readAddress() -> String? {
        guard let data = FileManager.default.contents(atPath: addressPath.string),
            let a = try? JSONDecoder().decode(Address.self, from: data)
        else { return nil }
        return a.url
    }

    func writeAddress(_ url: String) {
        let data = (try? JSONEncoder().encode(Address(url: url, pid: getpid()))) ?? Data()
        try? data.write(to: URL(fileURLWithPath: addressPath.string), options: .atomic)
    }

    func removeAddress() {
        try? FileManager.default.removeItem(atPath: addressPath.string)
    }

    func loadSettings() -> APISettings? {
        guard let data = FileManager.default.contents(atPath: settingsPath.string) else { return nil }
        return try? JSONDecoder().decode(APISettings.self, from: data)
    }

    /// The hooks the settings file names (`onComplete`, `onError`, `hookTimeout`): written there by
    /// the owner, never through the API, and kept when the daemon saves its settings.
    ///
    /// Only a file this user owns, with no access for group or others (0600), may name a
    /// program; from any other, hooks are ignored and `warn` says why.
    func loadHooks(warn: (String) -> Void = { _ in }) -> Hooks {
        guard let data = FileManager.default.contents(atPath: settingsPath.string),
            let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        else { return Hooks() }
        guard Self.hookKeys.contains(where: { object[$0] != nil }) else { return Hooks() }
        var st = stat()
        guard lstat(settingsPath.string, &st) == 0, st.st_mode & S_IFMT == S_IFREG, st.st_uid == geteuid(), st.st_mode & 0o077 == 0 else {
            warn("hooks in \(settingsPath) are ignored: the file must be this user's, mode 0600")
            return Hooks()
        }
        return Hooks(onComplete: object["onComplete"] as? String, onError: object["onError"] as? String,
                     timeout: ((object["hookTimeout"] as? NSNumber)?.doubleValue).flatMap { Seconds.isValid($0) ? $0 : nil } ?? 60)
    }

    static let hookKeys = ["onComplete", "onError", "hookTimeout"]

    /// Saves the settings (blocking calls: open, write, fsync, rename; run it on ``BlockingIO``).
    func saveSettings(_ s: APISettings) {
        guard var data = try? JSONEncoder().encode(s) else { return }
        // The hooks the owner wrote in the file stay.
        if let old = FileManager.default.contents(atPath: settingsPath.string),
            let oldObject = (try? JSONSerialization.jsonObject(with: old)) as? [String: Any],
            var object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] {
            for key in Self.hookKeys { if let v = oldObject[key] { object[key] = v } }
            if let merged = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) { data = merged }
        }
        // It may hold a proxy's password: created 0600 (exclusively, under a temporary name), then
        // renamed over the old one, so that it is never readable by others, not even for a moment;
        // its bytes durable before the rename: a crash leaves the old file or the new one whole.
        guard let name = settingsPath.lastComponent?.string,
            let dir = try? DirectoryHandle.open(settingsPath.removingLastComponent(), create: false)
        else { return }
        try? dir.replaceFile(name, with: Array(data))
    }
}
