import Foundation

/// Reading a partial file back: its digest, and whether another file holds the same bytes.
extension PartialFile {
    /// Whether the file `name` in `dir` holds exactly this file's `length` bytes
    /// (compared in 1 MiB blocks; false on any error).
    func holdsSameBytes(as name: String, in dir: DirectoryHandle, length: Int64) -> Bool {
        guard dir.size(name) == length, let other = try? dir.openFile(name, write: false) else { return false }
        defer { try? other.close() }
        let a = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        let b = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { a.deallocate(); b.deallocate() }
        var offset: Int64 = 0
        while offset < length {
            guard let n = try? fd.read(fromAbsoluteOffset: offset, into: a), n > 0,
                let m = try? other.read(fromAbsoluteOffset: offset, into: UnsafeMutableRawBufferPointer(rebasing: b[0..<n])), m == n,
                memcmp(a.baseAddress!, b.baseAddress!, n) == 0
            else { return false }
            offset += Int64(n)
        }
        return true
    }

    /// The digest of this file's bytes `start..<end` (to its end by default), read in 1 MiB blocks.
    func digest(_ algorithm: DigestAlgorithm, from start: Int64 = 0, to end: Int64 = .max) throws -> [UInt8] {
        var hasher = AnyHasher(algorithm)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { buffer.deallocate() }
        var offset = start
        while offset < end {
            let n: Int
            let want = Int(min(Int64(buffer.count), end - offset))
            do {
                n = try fd.read(fromAbsoluteOffset: offset, into: UnsafeMutableRawBufferPointer(rebasing: buffer[0..<want]))
            } catch { throw PickupError.io(path.string, error) }
            if n == 0 { break }
            offset += Int64(n)
            hasher.update(UnsafeRawBufferPointer(rebasing: buffer[0..<n]))
        }
        return hasher.finalize()
    }
}
