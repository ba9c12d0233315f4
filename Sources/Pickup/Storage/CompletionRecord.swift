import CPickupShims
import Crypto
import Foundation
import SystemPackage

/// What a finished download is: kept with the file (an extended attribute) and in the state
/// directory, so that a rerun can recognise its own file and ask the server whether it changed.
public struct CompletionRecord: Codable, Equatable, Sendable {
    /// The URL the user gave.
    public var url: String
    /// The file's name in its directory.
    public var name: String
    /// Validators of the representation the file holds.
    public var validators: Validators?
    /// The file's length.
    public var length: Int64
    /// Modification time (ns since the epoch) when it was finished, to notice a replaced file.
    public var mtime: Int64
    /// A digest verified before the file was put in place, when there was one.
    public var digest: ExpectedDigest?
    /// The directory the file was finished in (so that an index entry whose file is gone can be
    /// dropped: ``CompletionStore/sweep()``).
    public var directory: String?
}

/// Where Pickup keeps state outside the download directory.
public enum StateDirectory {
    /// `$PICKUP_STATE_DIR`, else `$XDG_STATE_HOME/pickup`, else `~/.local/state/pickup`
    /// (`~/Library/Application Support/Pickup` on Apple platforms).
    public static var `default`: FilePath {
        let env = ProcessInfo.processInfo.environment
        if let p = env["PICKUP_STATE_DIR"], !p.isEmpty { return FilePath(p) }
        #if canImport(Darwin)
        return FilePath(NSHomeDirectory()).appending("Library/Application Support/Pickup")
        #else
        if let x = env["XDG_STATE_HOME"], !x.isEmpty { return FilePath(x).appending("pickup") }
        return FilePath(NSHomeDirectory()).appending(".local/state/pickup")
        #endif
    }

    /// Creates a state directory (and its parents) if missing. On Apple platforms it is excluded
    /// from backups (iCloud, Time Machine): it holds the queue and records that a new download
    /// rebuilds, not documents.
    public static func prepare(_ directory: FilePath) throws(PickupError) {
        let existed = FS.isDirectory(directory)
        try FS.makeDirectories(directory)
        // Credentials of queued downloads may be kept in it: the owner's alone.
        if !existed { _ = chmod(directory.string, 0o700) }
        #if canImport(Darwin)
        if !existed {
            var url = URL(fileURLWithPath: directory.string, isDirectory: true)
            var values = URLResourceValues()
            values.isExcludedFromBackup = true
            try? url.setResourceValues(values)
        }
        #else
        _ = existed
        #endif
    }
}

/// Reads and writes completion records.
public struct CompletionStore: Sendable {
    static let attribute = "user.pickup.completed"
    /// The state directory.
    public let stateDirectory: FilePath

    /// A store in `stateDirectory`.
    public init(stateDirectory: FilePath) { self.stateDirectory = stateDirectory }

    func indexPath(directory: FilePath, url: String) -> FilePath {
        let key = Hex.encode(Array(SHA256.hash(data: Array("\(directory.string)\n\(url)".utf8)))).prefix(32)
        return stateDirectory.appending("completed").appending("\(key).json")
    }

    /// Attaches the record to the open file (before its rename), where extended attributes exist;
    /// returns its encoding, for ``index(_:url:directory:)``.
    @discardableResult
    func attach(_ record: CompletionRecord, to file: PartialFile) -> [UInt8] {
        let data = record.json
        _ = data.withUnsafeBytes { pickup_fsetxattr(file.fd.rawValue, Self.attribute, $0.baseAddress, $0.count) }
        return data
    }

    /// Records the finished file (its encoded record) in the state directory (best effort: the file
    /// itself is done).
    func index(_ data: [UInt8], url: String, directory: FilePath) {
        let path = indexPath(directory: directory, url: url)
        // Written in place, not renamed or fsynced: the finished file carries its own record (an
        // extended attribute), and an entry lost or torn by a crash reads as no entry, which only
        // costs a conditional request later.
        func write() throws {
            let fd = try FileDescriptor.open(path, .writeOnly, options: [.create, .truncate, .closeOnExec],
                                             permissions: [.ownerReadWrite])
            _ = try fd.closeAfter { try fd.writeAll(data) }
        }
        do {
            try write()
        } catch {
            // The first entry of this state directory: make its folder.
            try? StateDirectory.prepare(stateDirectory)
            try? FS.makeDirectories(path.removingLastComponent())
            try? write()
        }
        // Now and then (one finished file in 32, so about three per cent of the entries' count in
        // reads per file on average), drop the entries whose file is gone: the index stays in
        // proportion to the files that still exist. On a Dispatch queue, not on Swift's cooperative
        // pool: it reads every entry. (Cut short by the process ending, it has deleted only
        // entries it checked.)
        if UInt8.random(in: 0..<32) == 0 {
            let store = self
            DispatchQueue.global(qos: .utility).async { _ = store.sweep() }
        }
    }

    /// Deletes every index entry whose file is no longer in its directory with its length (or
    /// that cannot be read). Returns how many entries remain.
    @discardableResult
    public func sweep() -> Int {
        let folder = stateDirectory.appending("completed")
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: folder.string) else { return 0 }
        var kept = 0
        for name in names where name.hasSuffix(".json") {
            let entry = folder.appending(name)
            guard let data = FS.readFile(entry, limit: 65536),
                let rec = try? JSONDecoder().decode(CompletionRecord.self, from: Data(data)),
                let directory = rec.directory,
                FS.size(FilePath(directory).appending(rec.name)) == rec.length
            else {
                FS.remove(entry)
                continue
            }
            kept += 1
        }
        return kept
    }

    /// The record stored on an open file, if any.
    func attached(to fd: FileDescriptor) -> CompletionRecord? {
        var buf = [UInt8](repeating: 0, count: 16384)
        let n = buf.withUnsafeMutableBytes { pickup_fgetxattr(fd.rawValue, Self.attribute, $0.baseAddress, $0.count) }
        guard n > 0 else { return nil }
        return try? JSONDecoder().decode(CompletionRecord.self, from: Data(buf[0..<n]))
    }

    /// The finished download of `url` in `directory` (with `name` when the caller fixed the name),
    /// if the file there is still the one Pickup finished: same URL and length, and either its own
    /// attribute says so or its modification time is unchanged. An index entry whose file is gone
    /// or replaced is deleted.
    func lookup(url: String, in directory: DirectoryHandle, name: String?) -> (FilePath, CompletionRecord)? {
        var candidates: [(String, CompletionRecord?)] = []
        let entry = indexPath(directory: directory.path, url: url)
        var indexed: CompletionRecord? = nil
        if let data = FS.readFile(entry, limit: 65536),
            let rec = try? JSONDecoder().decode(CompletionRecord.self, from: Data(data))
        {
            indexed = rec
            if name == nil || rec.name == name { candidates.append((rec.name, rec)) }
        }
        if let name, !candidates.contains(where: { $0.0 == name }) { candidates.append((name, nil)) }
        for (name, indexed) in candidates {
            guard let fd = try? directory.openFile(name, write: false) else { continue }
            defer { try? fd.close() }
            guard let size = try? fd.seek(offset: 0, from: .end) else { continue }
            if let rec = attached(to: fd), rec.url == url, rec.length == size { return (directory.pathOf(name), rec) }
            if let rec = indexed, rec.length == size, rec.mtime == FS.mtime(fd) { return (directory.pathOf(name), rec) }
        }
        // The indexed file is gone or is another file now: the entry is of no more use.
        if let indexed, name == nil || indexed.name == name { FS.remove(entry) }
        return nil
    }
}
