import Foundation
import Pickup
import SystemPackage

/// Keeps every file a client names inside the download root: a name is a relative path with no
/// `..` and no component that starts with a dot (no hidden files or directories: `.ssh`, `.config`),
/// short enough for its helper files, and no part of it that exists may be a symlink or, but for
/// the last, anything other than a directory. Checking creates nothing; the engine and the
/// manager then reach the file only through directory handles opened from the root without
/// following symlinks (``DownloadRequest/root``), at every run and every deletion, so a directory
/// swapped for a symlink after this check leads nowhere. (aria2's RPC let a client write anywhere
/// through its `dir` option.)
enum Confinement {
    /// The absolute path inside `root` for `name`. Creates nothing.
    /// - Throws: ``APIError`` 400 `bad_name` saying why.
    static func resolve(_ name: String, in root: FilePath) throws(APIError) -> FilePath {
        guard !name.isEmpty, name.utf8.count <= 1024, !name.contains("\0") else {
            throw .badName("a name must be 1 to 1024 characters")
        }
        // No control characters (ESC, newlines...): a name is printed by `pickup ls` and shown in pages.
        guard !name.unicodeScalars.contains(where: { $0.value < 0x20 || ($0.value >= 0x7F && $0.value < 0xA0) }) else {
            throw .badName("a name must not contain control characters")
        }
        let path = FilePath(name)
        guard !path.isAbsolute, path.root == nil else { throw .badName("the name must be relative to the download root") }
        let parts = path.components.map(\.string).filter { $0 != "." }
        guard let last = parts.last else { throw .badName("the name has no file name") }
        if parts.contains("..") { throw .badName("the name must not contain '..'") }
        if let hidden = parts.first(where: { $0.hasPrefix(".") }) {
            throw .badName("'\(hidden)': names must not start with a dot")
        }
        if let long = parts.first(where: { $0.utf8.count > 255 }) { throw .badName("'\(long.prefix(40))...' is too long") }
        do throws(PickupError) { try SafeFileName.checkOutputName(last) } catch { throw .badName(error.description) }
        var current = root
        for (i, part) in parts.enumerated() {
            current = current.appending(part)
            guard let type = fileType(current) else { continue }  // not there yet: made at the first run
            let shown = parts[0...i].joined(separator: "/")
            if type == .typeSymbolicLink { throw .badName("'\(shown)' is a symbolic link") }
            if i < parts.count - 1, type != .typeDirectory { throw .badName("'\(shown)' is not a directory") }
            if i == parts.count - 1, type == .typeDirectory { throw .badName("'\(name)' is a directory") }
        }
        return current
    }

    /// `path` relative to `root`, or nil when it is not inside it.
    static func relative(_ path: FilePath, to root: FilePath) -> String? {
        var rest = path.lexicallyNormalized()
        guard rest.removePrefix(root) else { return nil }
        return rest.string.isEmpty ? nil : rest.string
    }

    /// `path` with every symlink resolved (as `realpath`).
    static func realPath(_ path: FilePath) -> FilePath {
        FilePath(URL(fileURLWithPath: path.string).resolvingSymlinksInPath().path)
    }

    private static func fileType(_ path: FilePath) -> FileAttributeType? {
        // attributesOfItem does not follow a symlink at the end: it reports the link itself.
        (try? FileManager.default.attributesOfItem(atPath: path.string))?[.type] as? FileAttributeType
    }
}
