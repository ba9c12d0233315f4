import Testing

@testable import Pickup

/// The read budget shared by a transport's connections: a TLS connection takes two shares.
@Suite struct ReadBudgetTests {
    @Test func tlsConnectionsTakeTwoSharesAndReadsStayInBounds() {
        #expect(ReadBudget.weight(of: "https://h/f") == 2 && ReadBudget.weight(of: "HTTPS://h/f") == 2)
        #expect(ReadBudget.weight(of: "ftps://h/f") == 2)
        #expect(ReadBudget.weight(of: "http://h/f") == 1 && ReadBudget.weight(of: "ftp://h/f") == 1)
        #expect(ReadBudget.weight(of: "") == 1 && ReadBudget.weight(of: "h") == 1)
        let budget = ReadBudget(maxRead: 1 << 20, budget: 1 << 20)
        #expect(budget.limit == 1 << 20)
        // 8 https connections: 16 shares, 64 KiB each; 8 http connections: 128 KiB each.
        budget.inFlight.wrappingIncrement(by: 8 * ReadBudget.weight(of: "https://h/f"), ordering: .relaxed)
        #expect(budget.limit == 64 << 10)
        budget.inFlight.store(8, ordering: .relaxed)
        #expect(budget.limit == 128 << 10)
        // Never below 64 KiB, however many.
        budget.inFlight.store(1000, ordering: .relaxed)
        #expect(budget.limit == ReadBudget.minRead)
    }
}
