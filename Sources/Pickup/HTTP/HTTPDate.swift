/// HTTP-date parsing and formatting (RFC 9110 §5.6.7), without Foundation date formatters.
///
/// Recipients must accept all three historical forms: IMF-fixdate
/// (`Sun, 06 Nov 1994 08:49:37 GMT`), RFC 850 (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime
/// (`Sun Nov  6 08:49:37 1994`).
public enum HTTPDate {
    static let months = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    static let dayNames = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"]  // 1970-01-01 was a Thursday
    static let monthNames = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// Seconds since 1970-01-01T00:00:00Z, or nil when the value is not an HTTP-date.
    public static func parse(_ value: String) -> Int64? {
        if let t = parseFixdate(value) { return t }
        let parts = value.split(whereSeparator: { $0 == " " || $0 == "," }).map(String.init)
        // IMF-fixdate: [Sun] [06] [Nov] [1994] [08:49:37] [GMT]
        if parts.count == 6, parts[5] == "GMT", let day = Int(parts[1]), let month = monthIndex(parts[2]),
            let year = Int(parts[3]), parts[3].count == 4, let t = time(parts[4])
        {
            return epoch(year: year, month: month, day: day, time: t)
        }
        // RFC 850: [Sunday] [06-Nov-94] [08:49:37] [GMT]
        if parts.count == 4, parts[3] == "GMT" {
            let dmy = parts[1].split(separator: "-").map(String.init)
            guard dmy.count == 3, let day = Int(dmy[0]), let month = monthIndex(dmy[1]), var year = Int(dmy[2]),
                let t = time(parts[2])
            else { return nil }
            if dmy[2].count == 2 { year += year < 70 ? 2000 : 1900 }
            return epoch(year: year, month: month, day: day, time: t)
        }
        // asctime: [Sun] [Nov] [6] [08:49:37] [1994]
        if parts.count == 5, let month = monthIndex(parts[1]), let day = Int(parts[2]), let t = time(parts[3]),
            let year = Int(parts[4])
        {
            return epoch(year: year, month: month, day: day, time: t)
        }
        return nil
    }

    /// IMF-fixdate, the form every current server sends, read straight from its 29 bytes
    /// (`Sun, 06 Nov 1994 08:49:37 GMT`); nil for anything else (then the general parser decides).
    static func parseFixdate(_ value: String) -> Int64? {
        var value = value
        return value.withUTF8 { b -> Int64? in
            guard b.count == 29, b[3] == UInt8(ascii: ","), b[4] == 0x20, b[7] == 0x20, b[11] == 0x20, b[16] == 0x20,
                b[19] == UInt8(ascii: ":"), b[22] == UInt8(ascii: ":"), b[25] == 0x20,
                b[26] == UInt8(ascii: "G"), b[27] == UInt8(ascii: "M"), b[28] == UInt8(ascii: "T")
            else { return nil }
            func digits(_ from: Int, _ count: Int) -> Int? {
                var v = 0
                for i in from..<from + count {
                    let d = Int(b[i]) - 48
                    guard (0...9).contains(d) else { return nil }
                    v = v * 10 + d
                }
                return v
            }
            // The month's three letters, case-insensitively, as one number to compare.
            let key = (Int(b[8] | 0x20) << 16) | (Int(b[9] | 0x20) << 8) | Int(b[10] | 0x20)
            guard let day = digits(5, 2), let year = digits(12, 4), let h = digits(17, 2), let m = digits(20, 2),
                let sec = digits(23, 2), h < 24, m < 60, sec <= 60,
                let month = monthKeys.firstIndex(of: key)
            else { return nil }
            return epoch(year: year, month: month + 1, day: day, time: Int64(h * 3600 + m * 60 + sec))
        }
    }

    static let monthKeys: [Int] = months.map { name in name.utf8.reduce(0) { $0 << 8 | Int($1) } }

    /// Formats seconds since the epoch as an IMF-fixdate.
    /// Seconds outside the years an HTTP-date may name are clamped to them.
    public static func format(_ seconds: Int64) -> String {
        let seconds = min(max(seconds, -11_644_473_600), 253_402_300_799)  // 1601-01-01 to 9999-12-31
        let days = seconds >= 0 ? seconds / 86400 : (seconds - 86399) / 86400
        let secs = seconds - days * 86400
        let (y, m, d) = civil(fromDays: days)
        func two(_ v: Int64) -> String { v < 10 ? "0\(v)" : "\(v)" }
        let dow = dayNames[Int(((days % 7) + 7) % 7)]
        return "\(dow), \(two(d)) \(monthNames[Int(m) - 1]) \(y) \(two(secs / 3600)):\(two(secs % 3600 / 60)):\(two(secs % 60)) GMT"
    }

    static func monthIndex(_ s: String) -> Int? {
        months.firstIndex(of: s.lowercased()).map { $0 + 1 }
    }

    static func time(_ s: String) -> Int64? {
        let p = s.split(separator: ":")
        guard p.count == 3, let h = Int64(p[0]), let m = Int64(p[1]), let sec = Int64(p[2]),
            (0..<24).contains(h), (0..<60).contains(m), (0...60).contains(sec)
        else { return nil }
        return h * 3600 + m * 60 + sec
    }

    /// The years an HTTP-date may name here: a server's date outside them is no date (a year of 15
    /// digits overflowed the day count and trapped), so every date is within ±2^38 seconds.
    static let years = 1601...9999

    static func epoch(year: Int, month: Int, day: Int, time: Int64) -> Int64? {
        guard (1...31).contains(day), years.contains(year), (1...12).contains(month) else { return nil }
        return days(year: Int64(year), month: Int64(month), day: Int64(day)) * 86400 + time
    }

    // Days from civil date (proleptic Gregorian), after H. Hinnant's public-domain algorithm.
    static func days(year: Int64, month: Int64, day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146097 + doe - 719468
    }

    static func civil(fromDays z0: Int64) -> (Int64, Int64, Int64) {
        let z = z0 + 719468
        let era = (z >= 0 ? z : z - 146096) / 146097
        let doe = z - era * 146097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (yoe + era * 400 + (m <= 2 ? 1 : 0), m, d)
    }
}

/// `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP-date.
public enum RetryAfter {
    /// Seconds to wait, given the header value and the current time (seconds since the epoch).
    /// Nil when the value is malformed; a date in the past gives 0.
    public static func seconds(_ value: String, now: Int64) -> Int64? {
        let v = Substring(value).trimmingSpaces
        if !v.isEmpty, v.allSatisfy({ $0.isASCII && $0.isNumber }) {
            // Leading zeros are no reason to refuse; twelve digits (31,000 years) bound the rest.
            let digits = v.drop(while: { $0 == "0" })
            return digits.count > 12 ? 999_999_999_999 : Int64(digits.isEmpty ? "0" : String(digits))
        }
        guard let date = HTTPDate.parse(String(v)) else { return nil }
        return max(0, date - now)
    }
}
