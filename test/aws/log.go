package awstest

import (
	"strconv"
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
