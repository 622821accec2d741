package mongowire

import "sync"

// FragmentHold stalls change streams before a fragment of a split event
// (see Server.HoldFragment). It is safe for concurrent use.
type FragmentHold struct {
	frag    int // 1-based fragment number; 0: the last fragment
	reached chan struct{}
	release chan struct{}
	once    sync.Once
	relOnce sync.Once
}

// HoldFragment arms a hold, a mongowire extension with no server
// equivalent, for tests that crash a client between the fragments of a
// $changeStreamSplitLargeEvent event: a getMore on a change stream whose
// next document is fragment frag (1-based; 0 or less: the event's last
// fragment) of a split event waits, before it builds its reply, until the
// hold is released or the cursor is killed (then it fails with
// CursorKilled, as a waiting getMore does on the server). Connections are
// served one request at a time, so a client that dies meanwhile is noticed
// only after the release, when the reply cannot be written. The client
// has then read every fragment before it: a getMore is only sent once the
// previous batch is consumed. Reached is closed when a getMore first
// waits. A hold applies to every stream of the server until Release; a new
// HoldFragment replaces it (releasing it).
func (s *Server) HoldFragment(frag int) *FragmentHold {
	h := &FragmentHold{frag: max(frag, 0), reached: make(chan struct{}), release: make(chan struct{})}
	if old := s.fragHold.Swap(h); old != nil {
		old.Release()
	}
	return h
}

// Reached is closed when a getMore first waits at the hold.
func (h *FragmentHold) Reached() <-chan struct{} { return h.reached }

// Release lets waiting and later getMores go on. It may be called more
// than once.
func (h *FragmentHold) Release() { h.relOnce.Do(func() { close(h.release) }) }

// holds reports whether h stalls a getMore whose next document is parts[0].
func (h *FragmentHold) holds(parts []eventPart) bool {
	if len(parts) == 0 || parts[0].tok.frag == 0 {
		return false
	}
	if h.frag == 0 {
		return len(parts) == 1 // the pending parts of an event end with its last
	}
	return int(parts[0].tok.frag) == h.frag
}

// waitFragmentHold stalls a getMore on stream c at an armed hold; the
// caller holds c.mu. It returns an error when the wait ended because the
// cursor was killed or the server is closing the connection.
func (s *Server) waitFragmentHold(cmd *command, id int64, c *streamCursor) error {
	h := s.fragHold.Load()
	if h == nil || !h.holds(c.parts) {
		return nil
	}
	select {
	case <-h.release:
		return nil
	default:
	}
	h.once.Do(func() { close(h.reached) })
	select {
	case <-h.release:
		return nil
	case <-c.killed:
		return cmdErr(codeCursorKilled, "cursor id %d was killed by killCursors while a getMore was waiting", id)
	case <-cmd.ctx.Done():
		return cmdErr(11600, "connection closed")
	}
}
