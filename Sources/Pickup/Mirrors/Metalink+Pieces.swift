/// A file's pieces as its piece hashes cut it.
extension Metalink.Pieces {
    /// The number of pieces of a file of `total` bytes, or nil when the hashes describe another
    /// length (then pieces are not checked).
    func count(total: Int64) -> Int? {
        guard total > 0, length > 0 else { return nil }
        let count = total / length + (total % length > 0 ? 1 : 0)
        return count == Int64(hashes.count) ? Int(count) : nil
    }

    /// Why piece hashes cannot check a file of `total` bytes.
    func uncheckable(total: Int64) -> String {
        "the \(hashes.count) piece hashes of \(length) bytes describe another length than the file's \(total) bytes; "
            + "it cannot be checked"
    }

    /// Piece `k`'s bytes (no sum past the length: it may be near Int64.max).
    func range(_ k: Int, total: Int64) -> (start: Int64, end: Int64) {
        let a = Int64(k) * length
        return (a, a + min(length, total - a))
    }
}
