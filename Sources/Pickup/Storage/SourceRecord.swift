/// What the control file keeps of a mirror: its URL, its own validators, and why its bytes were
/// refused (a mirror that sent other bytes is not asked again after a kill).
public struct SourceRecord: Codable, Equatable, Sendable {
    /// The mirror's URL as given.
    public var url: String
    /// The validators this mirror's responses carry (never sent to another server).
    public var validators: Validators?
    /// Why its bytes are not taken (a length that disagrees, a bad piece too many): kept across runs.
    public var rejected: String?

    public init(url: String, validators: Validators? = nil, rejected: String? = nil) {
        self.url = url
        self.validators = validators
        self.rejected = rejected
    }
}
