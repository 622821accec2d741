package kafka

import (
	"fmt"
	"strings"

	"github.com/changegate/changegate/event"
)

// TopicFields are the placeholders a topic template accepts, for messages.
// {operationType} is not one of them on purpose: the changes of one
// document must go to one topic (and partition) to keep their order.
const TopicFields = "{db}, {coll}, {source}"

// MaxTopicLen is Kafka's limit on a topic name.
const MaxTopicLen = 249

// Topic is a topic name template, compiled once: literal text and the
// placeholders {db}, {coll} and {source}. It is immutable and safe for
// concurrent use.
type Topic struct {
	parts []topicPart
}

type topicPart struct {
	lit   string
	field string // "", "db", "coll" or "source"
}

// CompileTopic parses s. It fails on an unknown placeholder, an unbalanced
// brace, literal text with characters Kafka does not accept in a topic name
// (anything but ASCII letters, digits, ".", "_" and "-"), or an empty
// template.
func CompileTopic(s string) (*Topic, error) {
	if s == "" {
		return nil, fmt.Errorf("must not be empty")
	}
	t := &Topic{}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, topicPart{lit: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return nil, fmt.Errorf(`unterminated "{"`)
			}
			name := s[i+1 : i+end]
			switch name {
			case "db", "coll", "source":
			default:
				return nil, fmt.Errorf("unknown placeholder {%s}; allowed: %s", name, TopicFields)
			}
			flush()
			t.parts = append(t.parts, topicPart{field: name})
			i += end
		case c == '}':
			return nil, fmt.Errorf(`unbalanced "}"`)
		case !topicChar(c):
			return nil, fmt.Errorf("character %q is not allowed in a Kafka topic name (use letters, digits, \".\", \"_\" and \"-\")", c)
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	if len(t.parts) == 1 && t.parts[0].field == "" {
		if msg := CheckTopicName(t.parts[0].lit); msg != "" {
			return nil, fmt.Errorf("%s", msg)
		}
	}
	return t, nil
}

// Fixed returns the topic and true when the template has no placeholder.
func (t *Topic) Fixed() (string, bool) {
	if len(t.parts) == 1 && t.parts[0].field == "" {
		return t.parts[0].lit, true
	}
	return "", false
}

// Execute returns the topic of e: the template with {db}, {coll} and
// {source} replaced by the event's namespace and source name (an event
// without a collection, such as dropDatabase, expands {coll} to "").
func (t *Topic) Execute(e *event.Event) string {
	if s, ok := t.Fixed(); ok {
		return s
	}
	var b strings.Builder
	for _, p := range t.parts {
		switch p.field {
		case "":
			b.WriteString(p.lit)
		case "db":
			b.WriteString(e.DB)
		case "coll":
			b.WriteString(e.Coll)
		case "source":
			b.WriteString(e.Source)
		}
	}
	return b.String()
}

// CheckTopicName returns why Kafka would refuse s as a topic name, or "":
// 1 to 249 ASCII letters, digits, ".", "_" and "-", and not "." or "..".
func CheckTopicName(s string) string {
	switch {
	case s == "":
		return "the topic name is empty"
	case s == "." || s == "..":
		return fmt.Sprintf("%q is not a valid topic name", s)
	case len(s) > MaxTopicLen:
		return fmt.Sprintf("the topic name is %d characters, Kafka accepts at most %d", len(s), MaxTopicLen)
	}
	for i := 0; i < len(s); i++ {
		if !topicChar(s[i]) {
			return fmt.Sprintf("topic name %q has the character %q; Kafka accepts letters, digits, \".\", \"_\" and \"-\"", s, s[i])
		}
	}
	return ""
}

func topicChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}
