import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// The control channel's replies: RFC 959 multi-line form, the replies that carry data, and no
/// trap on anything a server sends.
@Suite struct FTPReplyTests {
    func replies(_ lines: [String]) throws -> [FTPReply] {
        var p = FTPReplyParser()
        return try lines.compactMap { line throws(FTPReplyParser.Failure) in try p.feed(line) }
    }

    @Test func singleAndMultiLineReplies() throws {
        #expect(try replies(["220 Welcome"]) == [FTPReply(code: 220, lines: ["220 Welcome"])])
        let multi = try replies(["230-Hello", " 230 is not the end", "230-still not", "230 Logged in."])
        #expect(multi.count == 1 && multi[0].code == 230 && multi[0].lines.count == 4 && multi[0].text == "Logged in.")
        #expect(try replies(["200"]).first?.code == 200)
        #expect(throws: FTPReplyParser.Failure.self) { try replies(["hello"]) }
        #expect(throws: FTPReplyParser.Failure.self) { try replies(["20x ok"]) }
        #expect(throws: FTPReplyParser.Failure.self) { try replies(["200+ok"]) }
        #expect(throws: FTPReplyParser.Failure.tooLong) { try replies(["211-start"] + Array(repeating: "x", count: 300)) }
        #expect(FTPReply(code: 550, lines: ["550 No \u{1B}[31msuch file"]).text == "No [31msuch file")
    }

    @Test func repliesThatCarryData() {
        func r(_ line: String) -> FTPReply { FTPReply(code: Int(line.prefix(3)) ?? 0, lines: [line]) }
        #expect(FTPText.epsvPort(r("229 Entering Extended Passive Mode (|||6446|)")) == 6446)
        #expect(FTPText.epsvPort(r("229 (!!!21!)")) == 21)
        #expect(FTPText.epsvPort(r("229 (|||99999|)")) == nil)
        #expect(FTPText.epsvPort(r("229 (||6446|)")) == nil)
        #expect(FTPText.pasvPort(r("227 Entering Passive Mode (10,0,0,1,25,10)")) == 25 * 256 + 10)
        #expect(FTPText.pasvPort(r("227 =127,0,0,1,4,1")) == 1025)
        #expect(FTPText.pasvPort(r("227 (1,2,3,4,5)")) == nil)
        #expect(FTPText.pasvPort(r("227 (1,2,3,4,256,1)")) == nil)
        #expect(FTPText.mdtm(r("213 20261124103000")) == "20261124103000")
        #expect(FTPText.mdtm(r("213 20261124103000.123")) == "20261124103000.123")
        #expect(FTPText.mdtm(r("213 2026112410300")) == nil)
        #expect(FTPText.mdtm(r("213 20261124103000.")) == nil)
        #expect(FTPText.size(r("213 1048576")) == 1_048_576)
        #expect(FTPText.size(r("213 -1")) == nil)
        #expect(FTPText.size(r("213 99999999999999999999999")) == nil)
    }

    @Test func fuzzedLinesNeverTrap() {
        var rng = SystemRandomNumberGenerator()
        let seed = UInt64.random(in: 0...UInt64.max, using: &rng)
        print("FTP reply fuzz seed \(seed)")
        var random = SplitMix(state: seed)
        let pieces = ["227 ", "229 ", "213 ", "(", ")", "|", ",", "-", " ", "1", "9", "255", "65535", "99999999999999999999", ".", "\u{0}", "é"]
        for _ in 0..<3000 {
            var p = FTPReplyParser()
            for _ in 0..<Int(random.next() % 6) {
                let n = Int(random.next() % 12)
                let line = (0..<n).map { _ in pieces[Int(random.next() % UInt64(pieces.count))] }.joined()
                guard let reply = try? p.feed(line) else { continue }
                _ = FTPText.epsvPort(reply)
                _ = FTPText.pasvPort(reply)
                _ = FTPText.mdtm(reply)
                _ = FTPText.size(reply)
                _ = reply.summary
            }
        }
        // Commands cannot be smuggled through a URL.
        #expect(throws: TransportError.self) { try FTPTransport.target("ftp://h/a%0D%0ADELE%20b", headers: []) }
        #expect(throws: TransportError.self) { try FTPTransport.target("ftp://h/", headers: []) }
        let t = try? FTPTransport.target("ftp://h:2121/dir/a%20b.iso", headers: [("Authorization", "Basic " + Data("u:p:w".utf8).base64EncodedString())])
        #expect(t?.path == "dir/a b.iso" && t?.port == 2121 && t?.user == "u" && t?.password == "p:w")
        let (range, ifRange) = FTPTransport.range([("Range", "bytes=5-9"), ("If-Range", "\"x\"")])
        #expect(range?.first == 5 && range?.last == 9 && ifRange == "\"x\"")
        #expect(FTPTransport.range([("Range", "bytes=9-5")]).range == nil)
    }
}

/// Against pyftpdlib (Debian's python3-pyftpdlib, installed by .ci/run).
@Suite(.serialized, .enabled(if: FTPServerProcess.python != nil, "python3-pyftpdlib is not installed"))
struct FTPTests {
    @Test func anonymousDownloadOverSeveralSessions() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 3 << 20, seed: 51)
        site.write("f.bin", body)
        // Paced per data connection, so that more sessions open before the first has it all.
        let ftp = try FTPServerProcess(root: site.path.string, bytesPerSecond: 2 << 20)
        defer { ftp.stop() }
        let result = try await CLI.offPool {
            try CLI.capture(["get", ftp.url("/f.bin"), "-d", dir.path.string, "-x", "4"], state: state.path)
        }
        #expect(result.status == 0, "\(result.err) \(ftp.log)")
        let same = dir.read("f.bin") == body
        #expect(same)
        #expect(ftp.retrievals("/f.bin") >= 2, "\(ftp.log)")
        // Run again: the finished file is recognised (its SIZE and MDTM), nothing is fetched.
        let before = ftp.retrievals("/f.bin")
        let again = try await CLI.offPool { try CLI.capture(["get", ftp.url("/f.bin"), "-d", dir.path.string], state: state.path) }
        #expect(again.status == 0 && again.err.contains("unchanged"), "\(again.err)")
        #expect(ftp.retrievals("/f.bin") == before)
        #expect(dir.entries == ["f.bin"])
    }

    @Test func aKilledDownloadResumesAndAChangedFileIsNeverSpliced() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let v1 = Resource.bytes(count: 4 << 20, seed: 52)
        site.write("r.bin", v1)
        let ftp = try FTPServerProcess(root: site.path.string, bytesPerSecond: 1 << 20)
        defer { ftp.stop() }
        let part = dir.file("r.bin.pickup-part")
        let killed = try await CLI.startAndKill(["get", ftp.url("/r.bin"), "-o", dir.file("r.bin").string, "-q", "-x", "1"], state: state.path) {
            (FS.size(part) ?? 0) > 1 << 20
        }
        #expect(killed)
        // Resumed from where it was: REST, not the whole file again.
        let resumed = try await CLI.offPool {
            try CLI.capture(["get", ftp.url("/r.bin"), "-o", dir.file("r.bin").string, "-x", "1"], state: state.path)
        }
        #expect(resumed.status == 0, "\(resumed.err)")
        #expect(resumed.err.contains("resuming"), "\(resumed.err)")
        let same = dir.read("r.bin") == v1
        #expect(same)
        #expect(ftp.log.contains("REST"), "\(ftp.log)")

        // Killed again mid-way, then the file changes on the server (same size, a new time): the
        // held bytes are not combined with the new ones.
        let v2 = Resource.bytes(count: 4 << 20, seed: 53)
        site.write("s.bin", v1)
        let partS = dir.file("s.bin.pickup-part")
        let killedS = try await CLI.startAndKill(["get", ftp.url("/s.bin"), "-o", dir.file("s.bin").string, "-q", "-x", "1"], state: state.path) {
            (FS.size(partS) ?? 0) > 1 << 20
        }
        #expect(killedS)
        site.write("s.bin", v2)
        let later = Date().addingTimeInterval(120)
        try FileManager.default.setAttributes([.modificationDate: later], ofItemAtPath: site.file("s.bin").string)
        let changed = try await CLI.offPool {
            try CLI.capture(["get", ftp.url("/s.bin"), "-o", dir.file("s.bin").string, "-x", "1"], state: state.path)
        }
        #expect(changed.status == 0, "\(changed.err)")
        let isV2 = dir.read("s.bin") == v2
        #expect(isV2, "spliced or stale")
    }

    @Test func refusalsAreSaidInWords() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        site.write("x.bin", [1, 2, 3])
        try FileManager.default.createDirectory(atPath: site.file("sub").string, withIntermediateDirectories: true)
        let ftp = try FTPServerProcess(root: site.path.string)
        defer { ftp.stop() }
        let (missing, directory, login, good) = try await CLI.offPool {
            (try CLI.capture(["get", ftp.url("/nope.bin"), "-d", dir.path.string], state: state.path),
             try CLI.capture(["get", ftp.url("/sub"), "-d", dir.path.string], state: state.path),
             try CLI.capture(["get", ftp.url("/x.bin").replacingOccurrences(of: "ftp://", with: "ftp://alice:wrong@"), "-d", dir.path.string],
                             state: state.path),
             try CLI.capture(["get", ftp.url("/x.bin"), "-o", dir.file("y.bin").string, "-u", "alice:s3cret"], state: state.path))
        }
        #expect(missing.status == 4 && missing.err.contains("no such file"), "\(missing.err)")
        #expect(directory.status == 4 && directory.err.contains("is a directory"), "\(directory.err)")
        #expect(login.status == 4 && login.err.contains("refused the login as alice"), "\(login.err)")
        #expect(!login.err.contains("wrong"), "the password was shown")
        #expect(good.status == 0, "\(good.err)")
        #expect(dir.read("y.bin") == [1, 2, 3])
        #expect(dir.entries == ["y.bin"], "a refused download left files: \(dir.entries)")
    }
}

/// Against vsftpd (Debian's package, installed by .ci/run; it must start as root): FTPS with
/// explicit TLS, certificates verified, and its `require_ssl_reuse` said in words.
@Suite(.serialized, .enabled(if: VsftpdProcess.binary != nil && FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl"),
                             "vsftpd or openssl missing, or not root"))
struct FTPSTests {
    @Test func explicitTLSVerifiedAsForHTTPS() async throws {
        let site = TempDir(), keys = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 2 << 20, seed: 61)
        site.write("s.bin", body)
        chmod(site.file("s.bin").string, 0o644)
        let (cert, key) = try makeLoopbackCertificate(in: keys)
        let ftp = try VsftpdProcess(root: site.path.string, certificate: (cert, key))
        defer { ftp.stop() }
        let (unknown, trusted, plain) = try await CLI.offPool {
            (try CLI.capture(["get", ftp.url("/s.bin", secure: true), "-o", dir.file("a").string, "--retries", "1"], state: state.path),
             try CLI.capture(["get", ftp.url("/s.bin", secure: true), "-o", dir.file("b").string, "-x", "3", "--ca-certificate", cert],
                             state: state.path),
             try CLI.capture(["get", ftp.url("/s.bin"), "-o", dir.file("c").string], state: state.path))
        }
        #expect(unknown.status == 3 && unknown.err.contains("TLS"), "an unknown CA is refused: \(unknown.err)")
        #expect(trusted.status == 0, "\(trusted.err) \(ftp.log)")
        #expect(plain.status == 0, "\(plain.err) \(ftp.log)")
        let same = dir.read("b") == body && dir.read("c") == body
        #expect(same)
        #expect(ftp.log.contains("AUTH TLS"), "\(ftp.log)")
    }

    @Test func aServerThatRequiresTLSSessionReuseIsRefusedInWords() async throws {
        let site = TempDir(), keys = TempDir(), dir = TempDir(), state = TempDir()
        site.write("r.bin", Resource.bytes(count: 100_000, seed: 62))
        chmod(site.file("r.bin").string, 0o644)
        let (cert, key) = try makeLoopbackCertificate(in: keys)
        let ftp = try VsftpdProcess(root: site.path.string, certificate: (cert, key), requireSSLReuse: true)
        defer { ftp.stop() }
        let result = try await CLI.offPool {
            try CLI.capture(["get", ftp.url("/r.bin", secure: true), "-o", dir.file("r").string, "--ca-certificate", cert], state: state.path)
        }
        #expect(result.status == 4, "\(result.err) \(ftp.log)")
        #expect(result.err.contains("require_ssl_reuse"), "\(result.err)")
    }
}
