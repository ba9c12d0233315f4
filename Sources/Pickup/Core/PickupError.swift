import SystemPackage

/// Why a download stopped. Each case belongs to a ``PickupError/Category`` that the CLI turns
/// into its exit code.
public enum PickupError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The URL or an option is unusable.
    case invalidInput(String)
    /// The network failed and retries (which resume each time) ran out.
    case network(String)
    /// The server refused (4xx) or broke the protocol.
    case server(status: Int?, String)
    /// The finished bytes do not match the expected digest; nothing was put at the target.
    case verification(String)
    /// A file-system call failed (disk full, permission denied, ...). Bytes already durable stay.
    case fileSystem(String, Errno)
    /// A file is already at a fixed target (``Destination/file(_:)``, `-o PATH`) that is not the
    /// finished download of this URL, and overwriting was not allowed: nothing was written to it.
    case targetExists(String)
    /// Another process is downloading to the same partial file.
    case busy(String)
    /// Another process is driving a ``DownloadManager`` on the same state directory.
    case stateInUse(String)
    /// The download was interrupted (signal or cancellation) after checkpointing.
    case interrupted

    /// A file-system error from an untyped throw (swift-system throws `Errno` untyped).
    static func io(_ path: String, _ error: any Error) -> PickupError {
        .fileSystem(path, (error as? Errno) ?? .ioError)
    }

    /// Statuses that say the URL names nothing (404 Not Found, 410 Gone): said as "not found".
    static let notFound: Set<Int> = [404, 410]

    /// The server refused `url` with `status` (a 4xx, or a status not understood) for `why`:
    /// "not found: URL (404)" for ``notFound``, else the reason and the URL (credentials redacted).
    static func refused(_ url: String, status: Int, why: String) -> PickupError {
        let shown = DownloadURL.redacted(url)
        return .server(status: status, notFound.contains(status) ? "not found: \(shown) (\(status))" : "\(why) for \(shown)")
    }

    /// Broad kinds of failure, each with its own exit code.
    public enum Category: String, Sendable, Codable {
        case usage, network, server, verification, fileSystem, interrupted
    }

    /// The kind of failure.
    public var category: Category {
        switch self {
        case .invalidInput: .usage
        case .network: .network
        case .server: .server
        case .verification: .verification
        case .fileSystem, .targetExists, .busy, .stateInUse: .fileSystem
        case .interrupted: .interrupted
        }
    }

    /// One line for a person.
    public var description: String {
        switch self {
        case .invalidInput(let m): return m
        case .network(let m): return "network failure: \(m)"
        case .server(let status?, let m) where Self.notFound.contains(status): return m
        case .server(_, let m): return "server error: \(m)"
        case .verification(let m): return "verification failed: \(m)"
        case .fileSystem(let path, let errno):
            switch errno {
            case .noSpace: return "disk full while writing \(path); free some space and run again to resume"
            case .permissionDenied, .notPermitted: return "permission denied: \(path)"
            case .tooManySymbolicLinkLevels: return "\(path) is a symbolic link; refusing to write through it (remove it and run again)"
            default: return "\(path): \(errno.description)"
            }
        case .targetExists(let path):
            return "\(path) already exists and pickup did not download it from this URL; it is left as it is "
                + "(choose another name, or overwrite it: --overwrite)"
        case .busy(let path): return "another pickup process is already downloading to \(path)"
        case .stateInUse(let path):
            return "another process is already using the download state in \(path); stop it first or use another state directory"
        case .interrupted: return "interrupted"
        }
    }
}
