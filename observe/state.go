package observe

import "github.com/changegate/changegate/event"

// Key names the state one observer keeps on a change (event.Event's
// Observed): observers of one router each have their own key, so their
// states stay apart. Make one with NewKey, once per observer type.
type Key struct{ name string }

// NewKey returns a new key; name is for debugging.
func NewKey(name string) *Key { return &Key{name: name} }

// State is an observer's state on a change: a pointer to a type that
// embeds Slot.
type State interface{ link() *Slot }

// Slot links the states of one change's observers; embed it in a State.
type Slot struct{ o event.Observation }

func (s *Slot) link() *Slot { return s }

// Get returns the state k keeps on ev (nil: none). Shaped views of an
// event share its states.
func (k *Key) Get(ev *event.Event) State {
	for o := ev.Observed; o != nil; o = o.Next {
		if o.Key == k {
			return o.State.(State)
		}
	}
	return nil
}

// Set keeps st on ev under k. It costs no allocation (st links to the
// other states). It may be called only while the caller is alone with ev:
// in BeforeDispatch and Dispatched (before the change is handed to its
// sinks and before its views are made), and in AttemptStart of a
// re-delivery (the event is the re-delivery's own).
func (k *Key) Set(ev *event.Event, st State) {
	o := &st.link().o
	o.Key, o.State, o.Next = k, st, ev.Observed
	ev.Observed = o
}
