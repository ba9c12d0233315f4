import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import X509
#if canImport(Network) && canImport(NIOTransportServices)
import AsyncHTTPClient
import Network
#endif

/// A TLS failure of NIOSSL's, in words: the certificate is not trusted (self-signed, or issued by
/// an authority not trusted here), has expired, or names another host than the one asked for;
/// or the handshake failed for another reason, said by BoringSSL's reason code.
///
/// BoringSSL keeps why a certificate failed verification (`X509_V_ERR_*`) in the connection,
/// which NIOSSL does not expose: its error says only `CERTIFICATE_VERIFY_FAILED`. So for that
/// failure, and for a name that does not match, ``explain(_:url:tls:on:)`` looks at the
/// certificates themselves: a second handshake to the same address that keeps the server's
/// certificates and verifies nothing (it sends no request), bounded in time.
enum TLSFailure: Equatable {
    /// BoringSSL's `CERTIFICATE_VERIFY_FAILED`: the chain or the dates.
    case untrusted
    /// NIOSSL's hostname check: the certificate does not name the host asked for.
    case otherName
    /// The server does not speak TLS on that port (BoringSSL's `WRONG_VERSION_NUMBER`).
    case notTLS
    /// Any other failure: BoringSSL's reason code in lower case, or the error's own name.
    case other(String)

    /// What `error` is, nil when it is not a TLS error. A connection cut without TLS's close_notify
    /// (`uncleanShutdown`: the server or the path dropped it mid-response) is not one: it is a
    /// dropped connection, retried and resumed like any other.
    init?(_ error: any Error) {
        if case NIOSSLError.uncleanShutdown = error { return nil }
        #if canImport(Network) && canImport(NIOTransportServices)
        // Network.framework's (a direct request on Apple platforms), as AsyncHTTPClient passes it on.
        if let e = error as? HTTPClient.NWTLSError { self = Self(status: e.status); return }
        if #available(macOS 10.14, iOS 12, tvOS 12, watchOS 6, *), let e = error as? NWError, case .tls(let status) = e {
            self = Self(status: status)
            return
        }
        #endif
        if let e = error as? NIOSSLExtraError, e == .failedToValidateHostname {
            self = .otherName
        } else if let e = error as? NIOSSLError {
            guard case .handshakeFailed(let boring) = e else { self = .other("\(e)"); return }
            var reasons: [String] = []
            if case .sslError(let stack) = boring { reasons = stack.map { Self.reason($0.description) } }
            if reasons.contains("CERTIFICATE_VERIFY_FAILED") {
                self = .untrusted
            } else if reasons.contains("WRONG_VERSION_NUMBER") {
                self = .notTLS
            } else {
                self = .other(reasons.first.map { $0.lowercased().replacingOccurrences(of: "_", with: " ") } ?? "\(boring)")
            }
        } else {
            let name = String(reflecting: type(of: error))
            guard name.contains("SSL") || name.contains("TLS") || name.contains("Certificate") else { return nil }
            self = .other("\(error)")
        }
    }

    /// A TLS failure of Network.framework's, by its `OSStatus` (Security's `SecureTransport.h`):
    /// the chain (`errSSLXCertChainInvalid` -9807, `errSSLBadCert` -9808, `errSSLUnknownRootCert`
    /// -9812, `errSSLNoRootCert` -9813) or the dates (`errSSLCertExpired` -9814,
    /// `errSSLCertNotYetValid` -9815) are not trusted; `errSSLHostNameMismatch` (-9843) is another
    /// name; anything else is said by its number.
    init(status: Int32) {
        switch status {
        case -9807, -9808, -9812, -9813, -9814, -9815: self = .untrusted
        case -9843: self = .otherName
        default: self = .other("Security error \(status)")
        }
    }

    /// BoringSSL's reason code in one of its errors (`Error: 268435581 error:1000007d:SSL
    /// routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED at /path:123` has
    /// `CERTIFICATE_VERIFY_FAILED`).
    static func reason(_ description: String) -> String {
        let text = description.components(separatedBy: " at ").first ?? description
        return text.split(separator: ":").last.map { String($0) } ?? text
    }

    /// The advice a certificate that is not trusted ends with, and the one any other certificate failure ends with.
    static let advice = "(--ca-certificate FILE trusts a certificate; --insecure turns checking off: only on a network you trust)"
    static let insecure = "(--insecure turns checking off: only on a network you trust)"

    /// One line, without looking at the certificate; `host` is the host asked for (nil: unknown).
    func sentence(host: String?, port: Int? = nil) -> String {
        let of = host.map { "the certificate of \($0)" } ?? "the server's TLS certificate"
        switch self {
        case .untrusted: return "\(of) is not trusted (self-signed, issued by an unknown authority, or expired) \(Self.advice)"
        case .otherName: return "\(of) is for another name\(host.map { " (asked for \($0))" } ?? "") \(Self.insecure)"
        case .notTLS:
            let at = host.map { " at \($0)\(port.map { ":\($0)" } ?? "")" } ?? ""
            return "the server\(at) does not speak TLS (is the URL http://?)"
        case .other(let why): return "TLS handshake\(host.map { " with \($0)" } ?? "") failed: \(why)"
        }
    }

    /// One line from the server's certificates (leaf first): expired, not yet valid, self-signed,
    /// issued by an authority not trusted here, or for which names. Nil when they say nothing.
    func sentence(host: String, certificates: [NIOSSLCertificate], now: Date = Date()) -> String? {
        let parsed = certificates.compactMap { c in (try? c.toDERBytes()).flatMap { try? Certificate(derEncoded: $0) } }
        guard let leaf = parsed.first else { return nil }
        let of = "the certificate of \(host)"
        switch self {
        case .otherName:
            return "\(of) is for another name: it names \(Self.names(leaf)), not \(host) \(Self.insecure)"
        case .untrusted:
            if let expired = parsed.first(where: { $0.notValidAfter < now }) {
                let whose = expired == leaf ? of : "\(of) was issued by a certificate that"
                return "\(whose) expired on \(Self.day(expired.notValidAfter)) \(Self.insecure)"
            }
            if leaf.notValidBefore > now {
                return "\(of) is not valid until \(Self.day(leaf.notValidBefore)) (is this machine's clock right?)"
            }
            let top = parsed.last ?? leaf
            if top.issuer == top.subject, parsed.count == 1 {
                return "\(of) is not trusted: it is self-signed \(Self.advice)"
            }
            return "\(of) is not trusted: it is issued by \(top.issuer), an authority not trusted here \(Self.advice)"
        case .notTLS, .other:
            return nil
        }
    }

    /// The names a certificate is for: its subject alternative names, else its subject.
    static func names(_ certificate: Certificate) -> String {
        let sans = ((try? certificate.extensions.subjectAlternativeNames) ?? nil).map { Array($0) } ?? []
        let names = sans.compactMap { name -> String? in
            switch name {
            case .dnsName(let dns): return dns
            case .ipAddress(let ip): return address(Array(ip.bytes))
            default: return nil
            }
        }
        return names.isEmpty ? "\(certificate.subject)" : names.joined(separator: ", ")
    }

    /// An IP address's bytes (4 or 16) as text.
    static func address(_ bytes: [UInt8]) -> String? {
        guard bytes.count == 4 || bytes.count == 16 else { return nil }
        var text = [CChar](repeating: 0, count: 64)
        guard bytes.withUnsafeBytes({ inet_ntop(bytes.count == 4 ? AF_INET : AF_INET6, $0.baseAddress, &text, 64) }) != nil else { return nil }
        return String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    static func day(_ date: Date) -> String {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withFullDate]
        return f.string(from: date)
    }

    /// The error a request to `url` fails with when `error` is a certificate that is not trusted
    /// or names another host, said from the certificate itself; nil for any other error.
    /// The failure in words, with the certificates' own names and dates when they can be read;
    /// nil when `error` is not a certificate failure. Connects directly to the URL's host.
    ///
    /// Network.framework's failures (``isNetworkFramework(_:)``) say little: the kind is decided
    /// by NIOSSL's own verifying handshake (``verdict(host:port:tls:on:)``), and said from it.
    static func explain(_ error: any Error, url: String, tls: TLSConfiguration, on loop: any EventLoop) async -> TransportError? {
        guard var failure = TLSFailure(error), let origin = Origin(url) else { return nil }
        let host = origin.host.hasPrefix("[") ? String(origin.host.dropFirst().dropLast()) : origin.host
        if isNetworkFramework(error) {
            // (NIOSSL trusts what the system did not, or cannot reach it: the system's word stands.)
            guard let verdict = await verdict(host: host, port: origin.port, tls: tls, on: loop) else { return nil }
            failure = verdict
            guard failure == .untrusted || failure == .otherName else {
                return .fatal(failure.sentence(host: origin.host, port: origin.port))
            }
        }
        guard failure == .untrusted || failure == .otherName else { return nil }
        let certificates = await peerCertificates(host: host, port: origin.port, tls: tls, on: loop)
        return .fatal(failure.sentence(host: origin.host, certificates: certificates) ?? failure.sentence(host: origin.host))
    }

    /// Whether `error` is Network.framework's TLS failure (a direct request on Apple platforms).
    /// Its `OSStatus` says little: AsyncHTTPClient's verify block, when it installs one, only
    /// passes or fails, and the system then reports `errSSLBadCert` or `errSSLHandshakeFail`.
    static func isNetworkFramework(_ error: any Error) -> Bool {
        #if canImport(Network) && canImport(NIOTransportServices)
        if error is HTTPClient.NWTLSError { return true }
        if #available(macOS 10.14, iOS 12, tvOS 12, watchOS 6, *), let e = error as? NWError, case .tls = e { return true }
        #endif
        return false
    }

    /// How NIOSSL's verifying handshake with `host:port` (with `tls`, which trusts the system's
    /// roots) ends: the failure, or nil when it succeeds or does not end within 5 s.
    static func verdict(host: String, port: Int, tls: TLSConfiguration, on loop: any EventLoop) async -> TLSFailure? {
        guard let context = try? NIOSSLContext(configuration: tls) else { return nil }
        return await handshake(host: host, port: port, on: loop, otherwise: nil) { channel, hostname, finish in
            try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: context, serverHostname: hostname))
            try channel.pipeline.syncOperations.addHandler(HandshakeEnd(finish: finish))
        }
    }

    /// A TLS handshake with `host:port` on `loop`, bounded at 5 s: `install` adds the handlers
    /// (given the server name to send, nil for an IP address) and calls `finish` with the answer
    /// once; `otherwise` when the connection fails, closes first or the time runs out. The
    /// connection is closed before it returns.
    private static func handshake<T: Sendable>(
        host: String, port: Int, on loop: any EventLoop, otherwise: T,
        install: @escaping @Sendable (any Channel, String?, @escaping @Sendable (T) -> Void) throws -> Void
    ) async -> T {
        let hostname = (try? SocketAddress(ipAddress: host, port: port)) != nil ? nil : host
        let result = loop.makePromise(of: T.self)
        let done = NIOLockedValueBox(false)
        let finish: @Sendable (T) -> Void = { value in
            if done.withLockedValue({ d in defer { d = true }; return !d }) { result.succeed(value) }
        }
        let timeout = loop.scheduleTask(in: .seconds(5)) { finish(otherwise) }
        let connected = ClientBootstrap(group: loop)
            .connectTimeout(.seconds(5))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try install(channel, hostname, finish) }
            }
            .connect(host: host, port: port)
        connected.whenFailure { _ in finish(otherwise) }
        connected.whenSuccess { channel in channel.closeFuture.whenComplete { _ in finish(otherwise) } }
        let value = (try? await result.futureResult.get()) ?? otherwise
        timeout.cancel()
        if let channel = try? await connected.get() { try? await channel.close() }
        return value
    }

    /// Ends ``verdict(host:port:tls:on:)``: at the handshake's end, or at the first error.
    final class HandshakeEnd: ChannelInboundHandler {
        typealias InboundIn = NIOAny
        let finish: @Sendable (TLSFailure?) -> Void
        init(finish: @escaping @Sendable (TLSFailure?) -> Void) { self.finish = finish }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if let e = event as? TLSUserEvent, case .handshakeCompleted = e { finish(nil) }
            context.fireUserInboundEventTriggered(event)
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            finish(TLSFailure(error) ?? .other("\(error)"))
            context.close(promise: nil)
        }
    }

    /// The certificates `host:port` presents (leaf first), by a handshake that verifies nothing
    /// and ends at the certificates; empty when it does not get that far within 5 s.
    static func peerCertificates(host: String, port: Int, tls: TLSConfiguration, on loop: any EventLoop) async -> [NIOSSLCertificate] {
        var config = tls
        config.certificateVerification = .noHostnameVerification  // (a custom callback needs verification on)
        guard let context = try? NIOSSLContext(configuration: config) else { return [] }
        return await handshake(host: host, port: port, on: loop, otherwise: []) { channel, hostname, finish in
            let handler = try NIOSSLClientHandler(context: context, serverHostname: hostname) { certificates, verdict in
                finish(certificates)
                verdict.succeed(NIOSSLVerificationResult.failed)
            }
            try channel.pipeline.syncOperations.addHandler(handler)
        }
    }
}
