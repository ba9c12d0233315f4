import Crypto
import Foundation
import SystemPackage

extension FileDownload {
    /// Picks the final path: the name given with `-o`, else the server's suggestion, else the
    /// URL's last segment, else `download`; a free `name (n).ext` when something is already there,
    /// unless overwriting was asked for. Called with `lock` held.
    func chooseTarget(head: ResponseHead?) throws {
        let raw: String
        if let fixed = fixedName {
            raw = fixed
        } else {
            let suggested = head?["Content-Disposition"].flatMap(ContentDisposition.filename).flatMap(SafeFileName.sanitize)
            var fromURL: String? = nil
            for url in [resolvedURL, request.url] where suggested == nil && fromURL == nil {
                fromURL = SafeFileName.rawPath(ofURL: url).flatMap { SafeFileName.fromURLPath(String($0)) }
                    .flatMap(SafeFileName.sanitize)
            }
            raw = suggested ?? fromURL ?? "download"
        }
        record.target = freePath(for: raw).string
    }

    func freePath(for name: String) -> FilePath {
        let first = directory.appending(name)
        if request.overwrite || !FS.exists(first) { return first }
        var n = 1
        while true {
            let candidate = directory.appending(SafeFileName.numbered(name, n))
            if !FS.exists(candidate) && !FS.exists(FilePath(candidate.string + ".pickup-part")) {
                onEvent(.notice("\(first) already exists; saving as \(candidate.lastComponent?.string ?? "")"))
                return candidate
            }
            n += 1
        }
    }

    /// Every byte is held: verify, record, rename into place, clean up.
    func finish(file: PartialFile) throws -> (FilePath, Int64) {
        let (size, rec) = try lock.withLock {
            let size = record.totalLength ?? heldBytes()
            guard heldBytes() == size else {
                throw PickupError.server(status: nil, "internal: finishing with \(heldBytes()) of \(size) bytes")
            }
            if try file.size() > size { try file.truncate(to: size) }
            try file.sync()
            record.totalLength = size
            record.segments = [SegmentRecord(start: 0, end: size, done: size)]
            cursors = [:]
            lastSeen = [:]
            scheduler = nil
            if record.target == nil { try chooseTarget(head: nil) }
            // Recorded as complete before verifying (a kill then costs a verification, not the
            // bytes), unless no control file was ever needed (it all took less than a checkpoint).
            if controlOnDisk { try saveRecord() }
            return (size, record)
        }
        var verified: ExpectedDigest? = nil
        for expected in [request.checksum, rec.serverDigest].compactMap({ $0 }) {
            let actual = try Self.digest(of: partialPath, algorithm: expected.algorithm)
            guard actual == expected.bytes else {
                throw PickupError.verification(
                    "\(expected.algorithm.rawValue) from \(expected.source) is \(expected.hex) but the file's is \(Hex.encode(actual)); "
                        + "the bytes are kept in \(partialPath) (run with --restart to fetch them again)")
            }
            verified = expected
        }
        var target = FilePath(rec.target!)
        // The modification time is final now (neither the attribute nor the rename changes it), so
        // one encoding serves the attribute and the index.
        var completion = CompletionRecord(url: request.url, name: target.lastComponent?.string ?? "",
                                          validators: rec.validators, length: size, mtime: FS.mtime(file.fd) ?? 0,
                                          digest: verified)
        var encoded = store.attach(completion, to: file)
        while !(try place(at: target)) {
            // Something appeared at the target since we chose it: never replace it.
            target = freePath(for: target.lastComponent?.string ?? "download")
            completion.name = target.lastComponent?.string ?? ""
            encoded = store.attach(completion, to: file)
        }
        if lock.withLock({ controlOnDisk }) { ControlFile.remove(controlPath) }
        FS.syncDirectory(directory)
        store.index(encoded, url: completion.url, directory: directory)
        return (target, size)
    }

    /// Renames the partial file to `target`; false when a file appeared there and overwriting is off.
    func place(at target: FilePath) throws(PickupError) -> Bool {
        if request.overwrite {
            try FS.rename(partialPath, target)
            return true
        }
        do {
            try FS.moveNoReplace(partialPath, target)
            return true
        } catch {
            if case .targetExists = error { return false }
            throw error
        }
    }

    /// The digest of a file, read in 1 MiB blocks.
    static func digest(of path: FilePath, algorithm: DigestAlgorithm) throws -> [UInt8] {
        let fd: FileDescriptor
        do { fd = try FileDescriptor.open(path, .readOnly) } catch { throw PickupError.io(path.string, error) }
        defer { try? fd.close() }
        var hasher = AnyHasher(algorithm)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { buffer.deallocate() }
        while true {
            let n: Int
            do { n = try fd.read(into: buffer) } catch { throw PickupError.io(path.string, error) }
            if n == 0 { break }
            hasher.update(UnsafeRawBufferPointer(rebasing: buffer[0..<n]))
        }
        return hasher.finalize()
    }
}

/// One of swift-crypto's hash functions, chosen at run time.
struct AnyHasher {
    enum State {
        case sha256(SHA256), sha512(SHA512), sha1(Insecure.SHA1), md5(Insecure.MD5)
    }
    var state: State

    init(_ algorithm: DigestAlgorithm) {
        switch algorithm {
        case .sha256: state = .sha256(SHA256())
        case .sha512: state = .sha512(SHA512())
        case .sha1: state = .sha1(Insecure.SHA1())
        case .md5: state = .md5(Insecure.MD5())
        }
    }

    mutating func update(_ bytes: UnsafeRawBufferPointer) {
        switch state {
        case .sha256(var h): h.update(bufferPointer: bytes); state = .sha256(h)
        case .sha512(var h): h.update(bufferPointer: bytes); state = .sha512(h)
        case .sha1(var h): h.update(bufferPointer: bytes); state = .sha1(h)
        case .md5(var h): h.update(bufferPointer: bytes); state = .md5(h)
        }
    }

    func finalize() -> [UInt8] {
        switch state {
        case .sha256(let h): Array(h.finalize())
        case .sha512(let h): Array(h.finalize())
        case .sha1(let h): Array(h.finalize())
        case .md5(let h): Array(h.finalize())
        }
    }
}

/// Human-readable byte counts (binary units).
public enum ByteCount {
    /// `1.5 MiB`, `512 B`.
    public static func format(_ bytes: Int64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB"]
        var v = Double(bytes)
        var i = 0
        while v >= 1024, i < units.count - 1 {
            v /= 1024
            i += 1
        }
        return i == 0 ? "\(bytes) B" : String(format: "%.1f %@", v, units[i])
    }
}
