import Foundation
import HTTPTypes
import PickupDaemon
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
        #expect(throws: TransportError.self) { try FTPTransport.target("ftp://h/a%0D%0ADELE%20b", headers: [:]) }
        #expect(throws: TransportError.self) { try FTPTransport.target("ftp://h/", headers: [:]) }
        let t = try? FTPTransport.target("ftp://h:2121/dir/a%20b.iso", headers: [.authorization: "Basic " + Data("u:p:w".utf8).base64EncodedString()])
        #expect(t?.path == "dir/a b.iso" && t?.port == 2121 && t?.user == "u" && t?.password == "p:w")
        let (range, ifRange) = FTPTransport.range([.range: "bytes=5-9", .ifRange: "\"x\""])
        #expect(range?.first == 5 && range?.last == 9 && ifRange == "\"x\"")
        #expect(FTPTransport.range([.range: "bytes=9-5"]).range == nil)
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
        let ftp = try await FTPServerProcess(root: site.path.string, bytesPerSecond: 2 << 20)
        defer { ftp.stop() }
        let result = try await CLI.capture(["get", ftp.url("/f.bin"), "-d", dir.path.string, "-x", "4"], state: state.path)
        #expect(result.status == 0, "\(result.err) \(ftp.log)")
        let same = dir.read("f.bin") == body
        #expect(same)
        #expect(ftp.retrievals("/f.bin") >= 2, "\(ftp.log)")
        // Run again: the finished file is recognised (its SIZE and MDTM), nothing is fetched.
        let before = ftp.retrievals("/f.bin")
        let again = try await CLI.capture(["get", ftp.url("/f.bin"), "-d", dir.path.string], state: state.path)
        #expect(again.status == 0 && again.err.contains("unchanged"), "\(again.err)")
        #expect(ftp.retrievals("/f.bin") == before)
        #expect(dir.entries == ["f.bin"])
    }

    @Test func aKilledDownloadResumesAndAChangedFileIsNeverSpliced() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let v1 = Resource.bytes(count: 4 << 20, seed: 52)
        site.write("r.bin", v1)
        let ftp = try await FTPServerProcess(root: site.path.string, bytesPerSecond: 1 << 20)
        defer { ftp.stop() }
        let part = dir.file("r.bin.pickup-part")
        let killed = try await CLI.startAndKill(["get", ftp.url("/r.bin"), "-o", dir.file("r.bin").string, "-q", "-x", "1"], state: state.path) {
            (FS.size(part) ?? 0) > 1 << 20
        }
        #expect(killed)
        // Resumed from where it was: REST, not the whole file again.
        let resumed = try await CLI.capture(["get", ftp.url("/r.bin"), "-o", dir.file("r.bin").string, "-x", "1"], state: state.path)
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
        let changed = try await CLI.capture(["get", ftp.url("/s.bin"), "-o", dir.file("s.bin").string, "-x", "1"], state: state.path)
        #expect(changed.status == 0, "\(changed.err)")
        let isV2 = dir.read("s.bin") == v2
        #expect(isV2, "spliced or stale")
    }

    @Test func refusalsAreSaidInWords() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        site.write("x.bin", [1, 2, 3])
        try FileManager.default.createDirectory(atPath: site.file("sub").string, withIntermediateDirectories: true)
        let ftp = try await FTPServerProcess(root: site.path.string)
        defer { ftp.stop() }
        let (missing, directory, login, good) = (try await CLI.capture(["get", ftp.url("/nope.bin"), "-d", dir.path.string], state: state.path),
             try await CLI.capture(["get", ftp.url("/sub"), "-d", dir.path.string], state: state.path),
             try await CLI.capture(["get", ftp.url("/x.bin").replacingOccurrences(of: "ftp://", with: "ftp://alice:wrong@"), "-d", dir.path.string],
                             state: state.path),
             try await CLI.capture(["get", ftp.url("/x.bin"), "-o", dir.file("y.bin").string, "-u", "alice:s3cret"], state: state.path))
        #expect(missing.status == 4 && missing.err.contains("no such file"), "\(missing.err)")
        #expect(directory.status == 4 && directory.err.contains("is a directory"), "\(directory.err)")
        #expect(login.status == 4 && login.err.contains("refused the login as ***"), "\(login.err)")
        #expect(!login.err.contains("alice"), "the user name was shown: \(login.err)")
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
        let (cert, key) = try await makeLoopbackCertificate(in: keys)
        let ftp = try await VsftpdProcess(root: site.path.string, certificate: (cert, key))
        defer { ftp.stop() }
        let (unknown, trusted, plain) = (try await CLI.capture(["get", ftp.url("/s.bin", secure: true), "-o", dir.file("a").string, "--retries", "1"], state: state.path),
             try await CLI.capture(["get", ftp.url("/s.bin", secure: true), "-o", dir.file("b").string, "-x", "3", "--ca-certificate", cert],
                             state: state.path),
             try await CLI.capture(["get", ftp.url("/s.bin"), "-o", dir.file("c").string], state: state.path))
        #expect(unknown.status == 3 && unknown.err.contains("TLS"), "an unknown CA is refused: \(unknown.err)")
        #expect(trusted.status == 0, "\(trusted.err) \(ftp.log)")
        #expect(plain.status == 0, "\(plain.err) \(ftp.log)")
        let same = dir.read("b") == body && dir.read("c") == body
        #expect(same)
        #expect(ftp.log.contains("AUTH TLS"), "\(ftp.log)")
    }

    /// vsftpd limiting each session (`anon_max_rate`): killed over one session, the download
    /// resumes with REST over four, byte-exact.
    @Test func aKilledDownloadResumesOverSeveralRateLimitedSessions() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        // Large enough that a kill landing seconds late under load still leaves ranges to share.
        let body = Resource.bytes(count: 8 << 20, seed: 63)
        site.write("l.bin", body)
        chmod(site.file("l.bin").string, 0o644)
        let ftp = try await VsftpdProcess(root: site.path.string, bytesPerSecond: 1 << 20)
        defer { ftp.stop() }
        let part = dir.file("l.bin.pickup-part")
        let args = ["get", ftp.url("/l.bin"), "-o", dir.file("l.bin").string, "-q"]
        let killed = try await CLI.startAndKill(args + ["-x", "1"], state: state.path) { (FS.size(part) ?? 0) > 1 << 20 }
        #expect(killed)
        let resumed = try await CLI.capture(args + ["-x", "4"], state: state.path)
        #expect(resumed.status == 0, "\(resumed.err) \(ftp.log)")
        let same = dir.read("l.bin") == body
        #expect(same)
        let retrievals = ftp.log.components(separatedBy: "\"RETR ").count - 1
        #expect(retrievals >= 3, "the rest was not shared among sessions: \(ftp.log)")
        #expect(ftp.log.contains("\"REST "), "not resumed: \(ftp.log)")
    }

    @Test func aServerThatRequiresTLSSessionReuseIsRefusedInWords() async throws {
        let site = TempDir(), keys = TempDir(), dir = TempDir(), state = TempDir()
        site.write("r.bin", Resource.bytes(count: 100_000, seed: 62))
        chmod(site.file("r.bin").string, 0o644)
        let (cert, key) = try await makeLoopbackCertificate(in: keys)
        let ftp = try await VsftpdProcess(root: site.path.string, certificate: (cert, key), requireSSLReuse: true)
        defer { ftp.stop() }
        let result = try await CLI.capture(["get", ftp.url("/r.bin", secure: true), "-o", dir.file("r").string, "--ca-certificate", cert], state: state.path)
        #expect(result.status == 4, "\(result.err) \(ftp.log)")
        #expect(result.err.contains("require_ssl_reuse"), "\(result.err)")
    }
}

/// Against pyftpdlib scripted to misbehave (``FTPServerProcess/Faults``), and FTP through the
/// rest of Pickup: netrc, `-i` lists that mix http and ftp, the daemon across a kill.
@Suite(.serialized, .enabled(if: FTPServerProcess.python != nil, "python3-pyftpdlib is not installed"))
struct FTPFaultTests {
    /// Bytes the server sent of `name` (its log's `RETR ... completed=0|1 bytes=N` lines).
    static func bytesSent(_ ftp: FTPServerProcess, _ name: String) -> Int {
        ftp.log.components(separatedBy: "\n").filter { $0.contains("] RETR ") && $0.contains(name + " completed=") }.reduce(0) { sum, line in
            guard let r = line.range(of: " bytes=") else { return sum }
            return sum + (Int(line[r.upperBound...].prefix { $0.isNumber }) ?? 0)
        }
    }

    @Test func aDroppedDataConnectionResumesWhereItBroke() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 3 << 20, seed: 71)
        site.write("d.bin", body)
        let ftp = try await FTPServerProcess(root: site.path.string, faults: .init(dropAfter: 1 << 20, drops: 2))
        defer { ftp.stop() }
        let result = try await CLI.capture(["get", ftp.url("/d.bin"), "-d", dir.path.string, "-x", "1"], state: state.path)
        #expect(result.status == 0, "\(result.err) \(ftp.log)")
        let same = dir.read("d.bin") == body
        #expect(same)
        #expect(result.err.contains("data connection ended"), "\(result.err)")
        // Each break resumed with REST where it was: no byte was sent twice.
        #expect(ftp.log.contains("REST 1048576 350") && ftp.log.contains("REST 2097152 350"), "\(ftp.log)")
        #expect(Self.bytesSent(ftp, "d.bin") == body.count, "\(ftp.log)")
    }

    @Test func aServerThatRefusesRESTIsFetchedWholeAndNeverSpliced() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 4 << 20, seed: 72)
        site.write("r.bin", body)
        let ftp = try await FTPServerProcess(root: site.path.string, bytesPerSecond: 1 << 20, faults: .init(refuseREST: true))
        defer { ftp.stop() }
        let part = dir.file("r.bin.pickup-part")
        let args = ["get", ftp.url("/r.bin"), "-o", dir.file("r.bin").string, "-x", "1"]
        let killed = try await CLI.startAndKill(args + ["-q"], state: state.path) { (FS.size(part) ?? 0) > 1 << 20 }
        #expect(killed)
        // No restart: the held bytes are discarded and the whole file comes again from byte 0.
        let resumed = try await CLI.capture(args, state: state.path)
        #expect(resumed.status == 0, "\(resumed.err)")
        #expect(resumed.err.contains("held bytes are discarded"), "\(resumed.err)")
        let same = dir.read("r.bin") == body
        #expect(same)
        #expect(ftp.log.contains("REST") && ftp.log.contains("502"), "\(ftp.log)")
        // Several connections: the first whole answer is kept alone.
        let several = try await CLI.capture(["get", ftp.url("/r.bin"), "-o", dir.file("x4.bin").string, "-x", "4"], state: state.path)
        #expect(several.status == 0, "\(several.err)")
        let same4 = dir.read("x4.bin") == body
        #expect(same4)
    }

    @Test func tooManySessionsMeansFewerConnectionsNotAFailure() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 6 << 20, seed: 73)
        site.write("m.bin", body)
        let ftp = try await FTPServerProcess(root: site.path.string, bytesPerSecond: 2 << 20, faults: .init(maxSessions: 2))
        defer { ftp.stop() }
        let result = try await CLI.capture(["get", ftp.url("/m.bin"), "-d", dir.path.string, "-x", "4"], state: state.path)
        #expect(result.status == 0, "\(result.err) \(ftp.log)")
        let same = dir.read("m.bin") == body
        #expect(same)
        // The refused connections gave their ranges to the two the server takes, at once.
        #expect(result.err.contains("retired") && result.err.contains("421"), "\(result.err)")
        #expect(!result.err.contains("retrying"), "a refused session was retried: \(result.err)")
    }

    @Test func slowRepliesAreWaitedFor() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 300_000, seed: 74)
        site.write("s.bin", body)
        let ftp = try await FTPServerProcess(root: site.path.string, faults: .init(replyDelay: 0.4))
        defer { ftp.stop() }
        let result = try await CLI.capture(["get", ftp.url("/s.bin"), "-d", dir.path.string, "-x", "2"], state: state.path)
        #expect(result.status == 0, "\(result.err)")
        let same = dir.read("s.bin") == body
        #expect(same)
    }

    @Test func credentialsFromNetrcAndListsMixingHTTPAndFTP() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir(), lists = TempDir()
        let ftpBody = Resource.bytes(count: 500_000, seed: 75), httpBody = Resource.bytes(count: 400_000, seed: 76)
        site.write("n.bin", ftpBody)
        let ftp = try await FTPServerProcess(root: site.path.string)
        defer { ftp.stop() }
        let server = try await TestServer.start()
        server.set("/h.bin", Resource(body: httpBody))
        lists.write("netrc", Array("machine 127.0.0.1 login alice password s3cret\n".utf8))
        chmod(lists.file("netrc").string, 0o600)
        let netrc = try await CLI.capture(["get", ftp.url("/n.bin"), "-o", dir.file("n.bin").string, "--netrc-file", lists.file("netrc").string], state: state.path)
        #expect(netrc.status == 0, "\(netrc.err)")
        #expect(dir.read("n.bin") == ftpBody)
        #expect(ftp.log.contains("USER 'alice' logged in"), "the netrc login was not used: \(ftp.log)")
        #expect(!netrc.err.contains("s3cret"))

        lists.write("list.txt", Array("\(server.url("/h.bin")) out=h.bin\n\(ftp.url("/n.bin")) out=f.bin\n".utf8))
        let both = try await CLI.capture(["get", "-i", lists.file("list.txt").string, "-d", dir.path.string, "-x", "2", "-q"], state: state.path)
        #expect(both.status == 0, "\(both.err)")
        #expect(dir.read("h.bin") == httpBody)
        #expect(dir.read("f.bin") == ftpBody)
        await server.stop()
    }

    /// The daemon fetches ftp:// as it does http://: killed mid-transfer, the next daemon resumes
    /// with REST from its checkpoint.
    @Test func theDaemonResumesAnFTPDownloadAfterAKill() async throws {
        let site = TempDir(), root = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 4 << 20, seed: 77)
        site.write("d.bin", body)
        let ftp = try await FTPServerProcess(root: site.path.string, bytesPerSecond: 1 << 20)
        defer { ftp.stop() }
        let first = try await ServeProcess.start(root: root, state: state)
        defer { first.stopIfRunning() }
        _ = try await first.client.add(APIAddRequest(url: ftp.url("/d.bin"), name: "d.bin"))
        let durable = { ControlFile.load(root.file("d.bin.pickup-ctl"))?.durableBytes ?? 0 }
        #expect(await eventually { durable() > 1 << 20 }, "the download did not get going")
        #expect(await first.signal(SIGKILL) == .signalled(SIGKILL))
        let second = try await ServeProcess.start(root: root, state: state)
        defer { second.stopIfRunning() }
        try await second.waitUntil { $0.first?.state == "completed" }
        let same = root.read("d.bin") == body
        #expect(same)
        #expect(ftp.log.contains("REST "), "not resumed: \(ftp.log)")
        #expect(await second.signal(SIGTERM).exited)
    }
}
