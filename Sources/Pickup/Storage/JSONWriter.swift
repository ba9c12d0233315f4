/// Writes JSON by hand where JSONEncoder is too slow: the daemon's lists of thousands of downloads
/// (10,000 through JSONEncoder took about 50 ms; this takes a few) and the record of every finished
/// file. Produces what JSONEncoder would (absent optionals left out), so that JSONDecoder reads it;
/// tests decode both and compare.
package struct JSONWriter {
    package var bytes: [UInt8] = []

    package init(capacity: Int) { bytes.reserveCapacity(capacity) }

    package mutating func raw(_ s: StaticString) {
        s.withUTF8Buffer { bytes.append(contentsOf: $0) }
    }

    package mutating func string(_ s: String) {
        bytes.append(UInt8(ascii: "\""))
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "\""): raw(#"\""#)
            case UInt8(ascii: "\\"): raw(#"\\"#)
            case 0..<0x20:
                raw(#"\u00"#)
                let hex: [UInt8] = Array("0123456789abcdef".utf8)
                bytes.append(hex[Int(b >> 4)])
                bytes.append(hex[Int(b & 0xF)])
            default: bytes.append(b)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    package mutating func number(_ v: Int64) { bytes.append(contentsOf: String(v).utf8) }
    package mutating func number(_ v: Int) { bytes.append(contentsOf: String(v).utf8) }

    package mutating func bool(_ v: Bool) {
        if v { raw("true") } else { raw("false") }
    }

    package mutating func number(_ v: Double) {
        if v.isFinite { bytes.append(contentsOf: v.description.utf8) } else { raw("null") }
    }
}

extension CompletionRecord {
    /// The record as JSON (what JSONEncoder makes of it; written for every finished file).
    var json: [UInt8] {
        var w = JSONWriter(capacity: 256)
        w.raw(#"{"url":"#); w.string(url)
        w.raw(#","name":"#); w.string(name)
        if let directory { w.raw(#","directory":"#); w.string(directory) }
        if let v = validators {
            w.raw(#","validators":{"#)
            if let e = v.etag {
                w.raw(#""etag":{"opaque":"#); w.string(e.opaque)
                w.raw(#","isWeak":"#); w.bool(e.isWeak)
                w.raw("},")
            }
            if let lm = v.lastModified { w.raw(#""lastModified":"#); w.string(lm); w.raw(",") }
            w.raw(#""lastModifiedIsStrong":"#); w.bool(v.lastModifiedIsStrong)
            w.raw("}")
        }
        w.raw(#","length":"#); w.number(length)
        w.raw(#","mtime":"#); w.number(mtime)
        if let d = digest {
            w.raw(#","digest":{"source":"#); w.string(d.source)
            w.raw(#","algorithm":"#); w.string(d.algorithm.rawValue)
            w.raw(#","bytes":["#)
            for (i, b) in d.bytes.enumerated() {
                if i > 0 { w.raw(",") }
                w.number(Int(b))
            }
            w.raw("]}")
        }
        if let source { w.raw(#","source":"#); w.string(source) }
        w.raw("}")
        return w.bytes
    }
}
