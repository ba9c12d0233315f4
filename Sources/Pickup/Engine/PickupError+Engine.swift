/// A failure of a run, thrown from a response's sink: the transport hands it back unchanged.
extension PickupError: SinkError {}

extension TransportError {
    /// What a run ends with when this error is not retried (or retries ran out).
    var failure: PickupError {
        switch self {
        case .fatal(let m), .transient(let m), .busy(let m): .network(m)
        case .protocolViolation(let m): .server(status: nil, m)
        case .unresolved(let host): .network("cannot resolve \(host)")
        case .stalled: .network(message)
        case .proxyRefused(let status, _) where status >= 500: .network(message)
        case .proxyRefused(let status, _): .server(status: status, message)
        case .refused(let m): .server(status: nil, m)
        }
    }

    /// `15 s`, `0.5 s`.
    static func seconds(_ s: Double) -> String {
        s == s.rounded() && s.magnitude < 1e9 ? "\(Int(s)) s" : String(format: "%.1f s", s)
    }

    /// In words.
    var message: String {
        switch self {
        case .fatal(let m), .transient(let m), .protocolViolation(let m), .refused(let m), .busy(let m): m
        case .unresolved(let host): "cannot resolve \(host)"
        case .stalled(let seconds): "stalled: no data for \(Self.seconds(seconds))"
        case .proxyRefused(407, _):
            "the proxy needs credentials (407 Proxy Authentication Required): give them in the proxy URL, http://user:password@host:port"
        case .proxyRefused(let status, let reason) where status >= 500: "the proxy answered \(status) \(reason)"
        case .proxyRefused(let status, let reason): "the proxy refused: \(status) \(reason)"
        }
    }
}
