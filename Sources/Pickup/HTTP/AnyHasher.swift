import Crypto

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
