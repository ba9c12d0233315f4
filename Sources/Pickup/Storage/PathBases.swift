import Foundation
import SystemPackage

/// Named directories that stored paths are kept relative to, resolved again at each launch: iOS
/// moves an app's container between launches (after an update, a restore), so a path stored whole
/// would point outside the sandbox. A path inside a base is stored as `@NAME/rest`; any other as
/// it is. Give the same names at every launch, with where they are now: an app's container
/// (`NSHomeDirectory()`), its Documents, Caches, Application Support or App Group directory; on
/// Linux, any directory the whole state may move with.
public struct PathBases: Sendable, Equatable {
    /// The bases by name (a name: letters, digits, `-` and `_`).
    public var bases: [String: FilePath]

    /// The bases' paths with symlinks resolved, where they differ (`/private/var/...` for
    /// `/var/...` on Apple platforms): a path written either way is found in its base.
    var resolved: [String: FilePath] = [:]

    /// Bases by name (their real paths read once, here).
    public init(_ bases: [String: FilePath] = [:]) {
        self.bases = bases.filter { name, path in
            !name.isEmpty && name.allSatisfy { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" } && path.isAbsolute
        }
        for (name, base) in self.bases {
            if let real = realpath(base.string, nil) {
                let path = FilePath(String(cString: real))
                free(real)
                if path != base.lexicallyNormalized() { resolved[name] = path }
            }
        }
    }

    /// No bases: every path stored as it is.
    public static let none = PathBases()

    /// On Apple platforms, the app's container (`home`: `NSHomeDirectory()`, which holds Documents,
    /// Library and tmp); elsewhere none.
    public static var standard: PathBases {
        #if canImport(Darwin)
        PathBases(["home": FilePath(NSHomeDirectory())])
        #else
        .none
        #endif
    }

    /// `path` (absolute, or relative to the current directory) as stored: `@NAME/rest` inside the
    /// base that holds it most closely, else the absolute path.
    public func portable(_ path: FilePath) -> String {
        let absolute = (path.isAbsolute ? path : FilePath(FileManager.default.currentDirectoryPath).pushing(path)).lexicallyNormalized()
        var best: (name: String, depth: Int, rest: FilePath)?
        for (name, base) in bases.map({ ($0, $1) }) + resolved.map({ ($0, $1) }) {
            var rest = absolute
            guard rest.removePrefix(base.lexicallyNormalized()) else { continue }
            let depth = base.components.count
            if best == nil || depth > best!.depth || (depth == best!.depth && name < best!.name) { best = (name, depth, rest) }
        }
        guard let best else { return absolute.string }
        return best.rest.isEmpty ? "@\(best.name)" : "@\(best.name)/\(best.rest.string)"
    }

    /// A stored path, resolved against this launch's bases; nil when it names a base not given
    /// (said by the caller, never guessed). Paths not in `@NAME` form are returned as they are.
    public func resolve(_ stored: String) -> FilePath? {
        guard stored.hasPrefix("@") else { return FilePath(stored) }
        let body = stored.dropFirst()
        let name = String(body.prefix { $0 != "/" })
        guard let base = bases[name] else { return nil }
        let rest = body.dropFirst(name.count).drop { $0 == "/" }
        let path = rest.isEmpty ? base : base.pushing(FilePath(String(rest)))
        // (A stored path never climbs out of its base.)
        return path.lexicallyNormalized().starts(with: base.lexicallyNormalized()) ? path.lexicallyNormalized() : nil
    }
}
