package awstest

import (
	"strconv"
	"strings"
	"sync"
	"time"
)

// dedupEntry is what a FIFO queue or topic remembers of a deduplication id.
type dedupEntry struct {
	at        time.Time
	messageID string
	seq       string
}

// messageLog is what an SQS queue or an SNS topic keeps of the messages it
// accepted: their order and, when it is FIFO, the deduplication ids seen and
// the sequence numbers given. Its owner's lock guards it.
type messageLog[M any] struct {
	fifo     bool
	messages []M
	dedup    map[string]dedupEntry
	dups     int
	seq      uint64
}

func newMessageLog[M any](fifo bool) messageLog[M] {
	return messageLog[M]{fifo: fifo, dedup: map[string]dedupEntry{}}
}

// reset forgets the messages and the deduplication state.
func (l *messageLog[M]) reset() {
	l.messages, l.dups, l.dedup = nil, 0, map[string]dedupEntry{}
}

// copy returns the messages, each passed through clone.
func (l *messageLog[M]) copy(clone func(M) M) []M {
	out := make([]M, len(l.messages))
	for i, m := range l.messages {
		out[i] = clone(m)
	}
	return out
}

// store appends m (given a new message id, its sending time and, when FIFO,
// the next sequence number through set) or, for a FIFO duplicate of dedupID
// within window, drops it and returns the original's ids.
func (l *messageLog[M]) store(now time.Time, window time.Duration, dedupID string, m M, set func(m *M, messageID, seq string, at time.Time)) (messageID, seq string) {
	if l.fifo {
		if d, ok := l.dedup[dedupID]; ok && now.Sub(d.at) < window {
			l.dups++
			return d.messageID, d.seq
		}
		l.seq++
		seq = strconv.FormatUint(10_000_000_000_000_000_000+l.seq, 10)
	}
	messageID = newUUID()
	set(&m, messageID, seq, now)
	if l.fifo {
		l.dedup[dedupID] = dedupEntry{at: now, messageID: messageID, seq: seq}
	}
	l.messages = append(l.messages, m)
	return messageID, seq
}

// namedLog is one SQS queue or SNS topic: its name, the options it was
// created with (never changed after) and its message log.
type namedLog[M, O any] struct {
	name string
	opts O
	messageLog[M]
}

// messageLogs is the set of queues (SQS) or topics (SNS) of a server, by
// name, and the per-entry fault hook (FailEntries), under one lock.
type messageLogs[M, O any] struct {
	mu   sync.Mutex
	logs map[string]*namedLog[M, O]
	fail func(M) (code, message string, senderFault bool)
}

func newMessageLogs[M, O any]() messageLogs[M, O] {
	return messageLogs[M, O]{logs: map[string]*namedLog[M, O]{}}
}

// create adds log name with options o unless it exists; a name ending in
// ".fifo" makes a FIFO log.
func (s *messageLogs[M, O]) create(name string, o O) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.logs[name]; !ok {
		s.logs[name] = &namedLog[M, O]{name: name, opts: o, messageLog: newMessageLog[M](strings.HasSuffix(name, ".fifo"))}
	}
}

// exists reports whether log name exists.
func (s *messageLogs[M, O]) exists(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.logs[name]
	return ok
}

// lookup returns what a request to log name needs: whether it is FIFO, its
// options and the current fault hook; ok is false when it does not exist.
func (s *messageLogs[M, O]) lookup(name string) (fifo bool, opts O, fail func(M) (string, string, bool), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.logs[name]
	if l == nil {
		return false, opts, s.fail, false
	}
	return l.fifo, l.opts, s.fail, true
}

// messages returns a copy of the messages log name accepted, in order, each
// passed through clone (nil when it does not exist).
func (s *messageLogs[M, O]) messages(name string, clone func(M) M) []M {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.logs[name]
	if l == nil {
		return nil
	}
	return l.copy(clone)
}

// duplicates is how many messages FIFO log name dropped as duplicates.
func (s *messageLogs[M, O]) duplicates(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.logs[name]; l != nil {
		return l.dups
	}
	return 0
}

// setFail installs the per-entry fault hook (nil removes it).
func (s *messageLogs[M, O]) setFail(f func(M) (code, message string, senderFault bool)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = f
}

// reset forgets every log's messages and deduplication state and the fault
// hook; the logs remain.
func (s *messageLogs[M, O]) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.logs {
		l.reset()
	}
	s.fail = nil
}

// store appends m to log name (messageLog.store), which must exist, with
// the deduplication window window.
func (s *messageLogs[M, O]) store(name string, now time.Time, window time.Duration, dedupID string, m M, set func(m *M, messageID, seq string, at time.Time)) (messageID, seq string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logs[name].store(now, window, dedupID, m, set)
}
