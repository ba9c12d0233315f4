import Testing

@testable import TestServer

/// The tests' own ports (``Nginx/freePort()``): a port the kernel offers when no window outside
/// its ephemeral range has one is new to this run, and free again once chosen.
@Suite struct TestPortTests {
    @Test func theKernelsChoiceIsAPortNoServerOfThisRunHadAndFreeOnceChosen() throws {
        let a = try Nginx.kernelsChoice(), b = try Nginx.kernelsChoice()
        #expect(a != b && (1...65535).contains(a) && (1...65535).contains(b))
        #expect(Nginx.canBind(a) && Nginx.canBind(b))
    }
}
