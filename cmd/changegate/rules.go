package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
)

const rulesUsage = `Usage: changegate rules test -config FILE -events FILE.jsonl [-source NAME] [-json]

  test    dry-run the config's rules on recorded change events: for each
          event, which rules match, which sinks would receive it and the
          exact envelope each sink would be given. Connects to nothing.

-events holds one change event per line as MongoDB Extended JSON, canonical
or relaxed (what changegate tail prints; "-" reads standard input); blank
lines and lines starting with # are skipped. Each event is routed by every
source whose stream carries its namespace (or by -source only) with the
same compiled rules as run, including rules whose filter is also pushed
down into the change stream; "pushed-down $match" says whether MongoDB
would let the change out at all. Events are taken as the source reads them,
after the source's own pipeline stages. The config is read as check reads
it: ${VAR} secrets must be set (to anything valid; they are not used).

Output is human-readable, or with -json one JSON object per event and source
(a line that cannot be read gives {"line":N,"error":"..."}). A line that
cannot be read is reported with its number and the rest are still tested;
the exit status is then 1 (0 when every line was read, 2 for bad flags).

Example:
  changegate tail -config config.toml -source orders -n 100 > orders.jsonl
  changegate rules test -config config.toml -events orders.jsonl
`

func cmdRules(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprint(stderr, rulesUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, rest := args[0], args[1:]
	if sub != "test" {
		fmt.Fprintf(stderr, "changegate rules: unknown command %q\n\n%s", sub, rulesUsage)
		return 2
	}
	fs := newFlags("rules test", strings.TrimSuffix(rulesUsage, "\n"), stderr)
	path := fs.String("config", "", "path of the TOML config file (required)")
	events := fs.String("events", "", `file of change events, one Extended JSON object per line ("-": standard input) (required)`)
	src := fs.String("source", "", "route every event as this source's (default: each source whose stream carries the event's namespace)")
	asJSON := fs.Bool("json", false, "print one JSON object per event and source instead of text")
	if ok, code := parseFlags(fs, rest); !ok {
		return code
	}
	switch {
	case *path == "":
		fmt.Fprintln(stderr, "changegate rules test: -config is required")
		return 2
	case *events == "":
		fmt.Fprintln(stderr, "changegate rules test: -events is required")
		return 2
	}
	cfg, ok := loadConfig(*path, stderr)
	if !ok {
		return 1
	}
	if *src != "" && cfg.Source(*src) == nil {
		fmt.Fprintf(stderr, "changegate rules test: no source %q in %s (sources: %s)\n", *src, *path, sourceNames(cfg))
		return 2
	}
	dry, err := app.NewDryRun(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "changegate: invalid config:\n%v\n", err)
		return 1
	}
	var in io.Reader = os.Stdin
	if *events != "-" {
		f, err := os.Open(*events)
		if err != nil {
			fmt.Fprintf(stderr, "changegate rules test: %v\n", err)
			return 2
		}
		defer f.Close()
		in = f
	}
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	var out rulesPrinter = &textPrinter{w: w}
	if *asJSON {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false) // envelopes are printed byte for byte
		out = &jsonPrinter{enc: enc}
	}
	var bad []int
	r := bufio.NewReader(in)
	for n := 1; ; n++ {
		line, rerr := r.ReadBytes('\n')
		if len(line) > 0 {
			if err := testLine(dry, *src, n, line, out); err != nil {
				bad = append(bad, n)
				out.lineError(n, err)
			}
			if *events == "-" {
				_ = w.Flush() // tail | rules test: each event's outcome as it comes
			}
		}
		if rerr != nil {
			if !errors.Is(rerr, io.EOF) {
				_ = w.Flush()
				fmt.Fprintf(stderr, "changegate rules test: %s: line %d: %v\n", *events, n, rerr)
				return 1
			}
			break
		}
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintf(stderr, "changegate rules test: %v\n", err)
		return 1
	}
	if len(bad) > 0 {
		fmt.Fprintf(stderr, "changegate rules test: %s: %d line(s) could not be read: %s\n", *events, len(bad), joinInts(bad))
		return 1
	}
	return 0
}

// testLine routes the change event on line n (of any line ending) and
// prints the outcome; it returns an error for a line that is not a change
// event.
func testLine(dry *app.DryRun, source string, n int, line []byte, out rulesPrinter) error {
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] == '#' {
		return nil
	}
	raw, err := parseChange(line)
	if err != nil {
		return err
	}
	// The event as any source would see it: its namespace chooses the
	// sources, and a document that is not a change event is refused here.
	ev, err := event.FromChange("", 0, raw)
	if err != nil {
		return fmt.Errorf("not a change event: %w", err)
	}
	sources := []string{source}
	if source == "" {
		sources = dry.Sources(ev.DB, ev.Coll)
	}
	if len(sources) == 0 {
		out.unwatched(n, ev)
		return nil
	}
	for _, s := range sources {
		rt, err := dry.Route(s, uint64(n), raw)
		if err != nil {
			return err
		}
		out.routed(n, rt)
	}
	return nil
}

// parseChange reads one line of MongoDB Extended JSON (canonical or
// relaxed) into BSON, keeping every value's type and the order (and any
// duplicates) of keys.
func parseChange(line []byte) (bson.Raw, error) {
	var probe json.RawMessage
	if err := json.Unmarshal(line, &probe); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("not valid JSON: %v (at byte %d)", se, se.Offset)
		}
		return nil, fmt.Errorf("not valid JSON: %v", err)
	}
	if line[0] != '{' {
		return nil, errors.New("not a JSON object: want one change event per line")
	}
	var raw bson.Raw
	if err := bson.UnmarshalExtJSON(line, false, &raw); err != nil {
		return nil, fmt.Errorf("not valid Extended JSON: %v", err)
	}
	return raw, nil
}

// rulesPrinter writes the outcome of rules test, line by line.
type rulesPrinter interface {
	routed(n int, rt *app.Routed)
	unwatched(n int, ev *event.Event)
	lineError(n int, err error)
}

type textPrinter struct{ w io.Writer }

func (p *textPrinter) header(n int, ev *event.Event) {
	fmt.Fprintf(p.w, "line %d: %s", n, ev.OperationType)
	if ns := namespace(ev); ns != "" {
		fmt.Fprintf(p.w, " %s", ns)
	}
	if ev.DocumentKey != nil {
		fmt.Fprintf(p.w, " %s", extJSON(ev.DocumentKey))
	}
	fmt.Fprintln(p.w)
}

func (p *textPrinter) routed(n int, rt *app.Routed) {
	ev := rt.Event
	p.header(n, ev)
	fmt.Fprintf(p.w, "  source %s, id %s\n", ev.Source, ev.ID)
	switch rt.Pushdown {
	case app.PushdownPass:
		fmt.Fprintln(p.w, "    pushed-down $match: passes (MongoDB sends the change)")
	case app.PushdownDrop:
		fmt.Fprintln(p.w, "    pushed-down $match: filtered out in MongoDB (changegate never reads the change)")
	default:
		fmt.Fprintln(p.w, "    pushed-down $match: none (a rule of the source matches every change)")
	}
	if len(rt.Rules) == 0 {
		fmt.Fprintln(p.w, "    no rule matches: acknowledged, delivered nowhere")
		return
	}
	for _, h := range rt.Rules {
		local := ""
		if h.FilterLocal {
			local = " (its filter is evaluated in changegate only, not pushed down)"
		}
		fmt.Fprintf(p.w, "    rule %s matches -> %s%s\n", h.Rule, strings.Join(h.Sinks, ", "), local)
	}
	for _, d := range rt.Deliveries {
		fmt.Fprintf(p.w, "    sink %s (%s, %s JSON) via %s:\n", d.Sink.Name, d.Sink.Type, d.Sink.JSON, strings.Join(d.Rules, ", "))
		if d.Err != nil {
			fmt.Fprintf(p.w, "      not sent: dead-lettered (reason encode): %v\n", d.Err)
			continue
		}
		if d.Skipped {
			fmt.Fprintf(p.w, "      not sent: its shaped changes are empty (skip_empty_updates); acknowledged\n")
			continue
		}
		fmt.Fprintf(p.w, "      %s\n", d.Envelope)
	}
}

func (p *textPrinter) unwatched(n int, ev *event.Event) {
	p.header(n, ev)
	fmt.Fprintf(p.w, "  no source of the config reads namespace %s\n", namespace(ev))
}

func (p *textPrinter) lineError(n int, err error) {
	fmt.Fprintf(p.w, "line %d: error: %v\n", n, err)
}

type jsonPrinter struct{ enc *json.Encoder }

type rulesTestJSON struct {
	Line          int             `json:"line"`
	Source        string          `json:"source"`
	ID            string          `json:"id,omitempty"`
	OperationType string          `json:"operationType"`
	NS            string          `json:"ns,omitempty"`
	DocumentKey   json.RawMessage `json:"documentKey,omitempty"`
	Pushdown      string          `json:"pushdown,omitempty"`
	Rules         []rulesTestRule `json:"rules"`
	Sinks         []rulesTestSink `json:"sinks"`
	Note          string          `json:"note,omitempty"`
}

type rulesTestRule struct {
	Rule        string   `json:"rule"`
	Sinks       []string `json:"sinks"`
	FilterLocal bool     `json:"filterInChangegateOnly,omitempty"`
}

type rulesTestSink struct {
	Sink     string          `json:"sink"`
	Type     string          `json:"type"`
	JSON     string          `json:"json"`
	Rules    []string        `json:"rules"`
	Envelope json.RawMessage `json:"envelope,omitempty"`
	// Error: the envelope cannot be encoded; the sink dead-letters the
	// event with reason DeadLetter.
	Error      string `json:"error,omitempty"`
	DeadLetter string `json:"deadLetterReason,omitempty"`
	// Skipped: not sent (skip_empty_updates), acknowledged.
	Skipped bool `json:"skipped,omitempty"`
}

func (p *jsonPrinter) base(n int, ev *event.Event) rulesTestJSON {
	r := rulesTestJSON{Line: n, Source: ev.Source, OperationType: ev.OperationType, NS: namespace(ev),
		Rules: []rulesTestRule{}, Sinks: []rulesTestSink{}}
	if ev.DocumentKey != nil {
		r.DocumentKey = extJSON(ev.DocumentKey)
	}
	return r
}

func (p *jsonPrinter) routed(n int, rt *app.Routed) {
	r := p.base(n, rt.Event)
	r.ID, r.Pushdown = rt.Event.ID, rt.Pushdown
	for _, h := range rt.Rules {
		r.Rules = append(r.Rules, rulesTestRule{Rule: h.Rule, Sinks: h.Sinks, FilterLocal: h.FilterLocal})
	}
	for _, d := range rt.Deliveries {
		s := rulesTestSink{Sink: d.Sink.Name, Type: d.Sink.Type, JSON: string(d.Sink.JSON), Rules: d.Rules, Envelope: d.Envelope, Skipped: d.Skipped}
		if d.Err != nil {
			s.Error, s.DeadLetter = d.Err.Error(), "encode"
		}
		r.Sinks = append(r.Sinks, s)
	}
	_ = p.enc.Encode(r)
}

func (p *jsonPrinter) unwatched(n int, ev *event.Event) {
	r := p.base(n, ev)
	r.Note = "no source of the config reads namespace " + namespace(ev)
	_ = p.enc.Encode(r)
}

func (p *jsonPrinter) lineError(n int, err error) {
	_ = p.enc.Encode(struct {
		Line  int    `json:"line"`
		Error string `json:"error"`
	}{n, err.Error()})
}

// namespace returns "db.coll", "db" or "".
func namespace(ev *event.Event) string {
	if ev.Coll == "" {
		return ev.DB
	}
	return ev.DB + "." + ev.Coll
}

// extJSON returns doc as relaxed Extended JSON (as envelopes write it), or
// a JSON string describing why it cannot be written.
func extJSON(doc bson.Raw) json.RawMessage {
	b, err := bson.MarshalExtJSON(doc, false, false)
	if err != nil {
		b, _ = json.Marshal("unprintable: " + err.Error())
	}
	return b
}

func sourceNames(cfg *config.Config) string {
	names := make([]string, len(cfg.Sources))
	for i, s := range cfg.Sources {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}
