import Pickup
import Testing

/// The queue as a state machine, without sockets: ordering, limits, transitions.
@Suite struct DownloadQueueTests {
    func id(_ n: Int64) -> DownloadID { DownloadID(rawValue: n) }

    func queue(_ order: QueueOrder, priorities: [Int] = [0, 0, 0, 0]) -> DownloadQueue {
        var q = DownloadQueue(order: order)
        for (i, p) in priorities.enumerated() { q.add(id(Int64(i + 1)), state: .waiting, priority: p) }
        return q
    }

    @Test func fifoStartsTheOldestFirstAndRespectsTheLimit() {
        var q = queue(.fifo)
        #expect(q.startNext(active: 0, limit: 2) == [id(1), id(2)])
        #expect(q.startNext(active: 2, limit: 2) == [])
        #expect(q.count(.running) == 2)
        #expect(true == q.transition(id(1), to: .completed))
        #expect(q.startNext(active: 1, limit: 2) == [id(3)])
    }

    @Test func lifoStartsTheNewestFirst() {
        var q = queue(.lifo)
        #expect(q.startNext(active: 0, limit: 3) == [id(4), id(3), id(2)])
    }

    @Test func priorityComesBeforeOrder() {
        var q = queue(.fifo, priorities: [0, 5, 0, 5])
        #expect(q.startNext(active: 0, limit: 4) == [id(2), id(4), id(1), id(3)])
        var l = queue(.lifo, priorities: [0, 5, 0, 5])
        #expect(l.startNext(active: 0, limit: 4) == [id(4), id(2), id(3), id(1)])
    }

    @Test func aDownloadWhoseLastTransferIsStillEndingWaits() {
        var q = queue(.fifo)
        #expect(q.startNext(active: 1, limit: 3, busy: [id(1)]) == [id(2), id(3)])
        #expect(q.waiting == [id(1), id(4)])
    }

    @Test func batchModeStartsEverything() {
        var q = queue(.fifo)
        #expect(q.startNext(active: 3, limit: nil).count == 4)
    }

    @Test func pausedAndFinishedDownloadsNeverStart() {
        var q = queue(.fifo)
        #expect(true == q.transition(id(1), to: .paused))
        #expect(q.startNext(active: 0, limit: 1) == [id(2)])
        #expect(true == q.transition(id(2), to: .failed))
        #expect(q.startNext(active: 0, limit: 1) == [id(3)])
        // Resuming puts it back in its place, not at the end.
        #expect(true == q.transition(id(1), to: .waiting))
        #expect(q.startNext(active: 0, limit: 1) == [id(1)])
    }

    @Test func onlyAllowedTransitionsHappen() {
        var q = queue(.fifo, priorities: [0])
        #expect(false == q.transition(id(1), to: .completed))  // waiting cannot complete without running
        #expect(false == q.transition(id(1), to: .failed))
        #expect(true == q.transition(id(1), to: .running))
        #expect(false == q.transition(id(1), to: .running))
        #expect(true == q.transition(id(1), to: .completed))
        #expect(false == q.transition(id(1), to: .paused))  // a finished download cannot be paused
        #expect(true == q.transition(id(1), to: .waiting))  // but can be queued again
        #expect(false == q.transition(id(9), to: .running))  // unknown
    }

    @Test func moveToFrontMakesItNextWhateverItsPriority() {
        for order in [QueueOrder.fifo, .lifo] {
            var q = queue(order, priorities: [0, 3, 0, 1])
            q.moveToFront(id(3))
            #expect(q.waiting.first == id(3), "\(order)")
            #expect(q.entries[id(3)]?.priority == 3)
            // Added later, at the same priority, it still does not overtake in FIFO.
            q.add(id(5), state: .waiting, priority: 3)
            #expect(q.waiting.first == (order == .fifo ? id(3) : id(5)))
        }
    }

    @Test func priorityChangesReorderTheWaitingList() {
        var q = queue(.fifo)
        q.setPriority(id(4), 10)
        #expect(q.waiting == [id(4), id(1), id(2), id(3)])
        q.setOrder(.lifo)
        #expect(q.waiting == [id(4), id(3), id(2), id(1)])
    }

    @Test func loweringTheLimitSendsBackTheDownloadsTheOrderLikesLeast() {
        var q = queue(.fifo, priorities: [0, 0, 2, 0])
        let started = q.startNext(active: 0, limit: 4)
        #expect(q.overLimit(running: started, limit: 2) == [id(2), id(4)])
        #expect(q.overLimit(running: started, limit: 4) == [])
    }

    @Test func restoredPlacesKeepTheirOrder() {
        var q = DownloadQueue(order: .fifo)
        q.add(id(7), state: .waiting, priority: 0, place: 30)
        q.add(id(8), state: .waiting, priority: 0, place: 10)
        q.add(id(9), state: .paused, priority: 0, place: 20)
        #expect(q.waiting == [id(8), id(7)])
        #expect(q.nextPlace == 31)
    }

    @Test func tenThousandStayOrdered() {
        var q = DownloadQueue(order: .fifo)
        for i in 1...10_000 { q.add(id(Int64(i)), state: .waiting, priority: i % 3) }
        let first = q.startNext(active: 0, limit: 5)
        #expect(first == [id(2), id(5), id(8), id(11), id(14)])
        #expect(q.count(.waiting) == 9_995)
        q.remove(id(17))
        #expect(q.waiting.prefix(2) == [id(20), id(23)])
    }
}
