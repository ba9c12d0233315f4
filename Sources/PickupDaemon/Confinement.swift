import Foundation
import SystemPackage

/// Keeps every file a client names inside the download root: a name is a relative path with no
/// `..`, and no part of it that exists may be a symlink (one could point anywhere) or, but for the
/// last, anything other than a directory. (aria2's RPC let a client write anywhere through its
/// `dir` option.)
enum Confinement {
    /// The absolute path inside `root` for `name`, creating the directories on the way.
    /// - Throws: ``APIError`` 400 `bad_name` saying why.
    static func resolve(_ name: String, in root: FilePath) throws(APIError) -> FilePath {
        guard !name.isEmpty, name.utf8.count <= 1024, !name.contains("\0") else {
            throw .badName("a name must be 1 to 1024 characters")
        }
        let path = FilePath(name)
        guard !path.isAbsolute, path.root == nil else { throw .badName("the name must be relative to the download root") }
        let parts = path.components.map(\.string).filter { $0 != "." }
        guard !parts.isEmpty else { throw .badName("the name has no file name") }
        if parts.contains("..") { throw .badName("the name must not contain '..'") }
        var current = root
        for (i, part) in parts.enumerated() {
            current = current.appending(part)
            let last = i == parts.count - 1
            guard let type = fileType(current) else {
                if !last { mkdir(current) }
                continue
            }
            if type == .typeSymbolicLink { throw .badName("'\(parts[0...i].joined(separator: "/"))' is a symbolic link") }
            if !last, type != .typeDirectory { throw .badName("'\(parts[0...i].joined(separator: "/"))' is not a directory") }
            if last, type == .typeDirectory { throw .badName("'\(name)' is a directory") }
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

    private static func mkdir(_ path: FilePath) {
        try? FileManager.default.createDirectory(atPath: path.string, withIntermediateDirectories: false)
    }
}
