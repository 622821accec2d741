package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

const subscriptionsUsage = `Usage: changegate subscriptions COMMAND [flags] [NAME]

Manages the subscriptions of a running changegate through its admin API
(/api/v1/subscriptions; [subscriptions] enabled):

  list [-limit N] [-after CURSOR]   one subscription per line (JSON), the file's
                                    names read-only among them; "next: CURSOR"
                                    on standard error when more follow
  show NAME                         the subscription
  create -f FILE                    create from a JSON body (- reads standard
                                    input); prints the subscription with its
                                    signing secret, shown this once
  pause NAME [-reason TEXT]         park its events until resumed
  resume NAME                       deliver what was parked, in order, then go on
  rotate-secret NAME [-overlap D]   a new signing secret (shown this once); the
                                    old one signs too for D (default 24h)
  delete NAME                       stop it and remove it

The API is -api URL (default $CHANGEGATE_API_URL, else http://127.0.0.1:9464).
The token is read from -token-file FILE or $CHANGEGATE_API_TOKEN, never from
the command line: the admin token, or a [[server.tokens]] token, which manages
only the names with its prefix. An answer other than 2xx is printed on
standard error with its problems (JSON paths) and exits 1.
`

// apiClient calls a running changegate's admin API.
type apiClient struct {
	base   string
	token  string
	client *http.Client
}

func cmdSubscriptions(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(stderr, subscriptionsUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			return 0
		}
		return 2
	}
	sub, rest := args[0], args[1:]
	fs := newFlags("subscriptions "+sub, subscriptionsUsage, stderr)
	api := fs.String("api", "", "the admin API's base URL (default $CHANGEGATE_API_URL, else http://127.0.0.1:9464)")
	tokenFile := fs.String("token-file", "", "a file holding the API token (default $CHANGEGATE_API_TOKEN)")
	var (
		limit, after, file, reason, overlap *string
		name                                string
	)
	switch sub {
	case "list":
		limit = fs.String("limit", "", "at most this many per page")
		after = fs.String("after", "", "the next page: the cursor a listing printed (next: ...)")
	case "create":
		file = fs.String("f", "", "the subscription's JSON body (- for standard input; required)")
	case "pause":
		reason = fs.String("reason", "", "why, recorded with the pause")
	case "rotate-secret":
		overlap = fs.String("overlap", "", "how long the old secret signs too (default 24h)")
	case "show", "resume", "delete":
	default:
		fmt.Fprintf(stderr, "changegate subscriptions: unknown command %q\n\n%s", sub, subscriptionsUsage)
		return 2
	}
	// NAME first or last: "pause team-a-x -reason r" and "pause -reason r team-a-x".
	if needsName(sub) && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		name, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if needsName(sub) && name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return 2
	}
	if needsName(sub) && name == "" {
		fmt.Fprintf(stderr, "changegate subscriptions %s: a subscription NAME is required\n", sub)
		return 2
	}
	c, err := newAPIClient(*api, *tokenFile)
	if err != nil {
		fmt.Fprintf(stderr, "changegate subscriptions: %v\n", err)
		return 2
	}
	path := "/api/v1/subscriptions"
	if name != "" {
		path += "/" + url.PathEscape(name)
	}
	var (
		method = http.MethodPost
		body   []byte
		secret bool
	)
	switch sub {
	case "list":
		method = http.MethodGet
		q := url.Values{}
		if *limit != "" {
			q.Set("limit", *limit)
		}
		if *after != "" {
			q.Set("after", *after)
		}
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
	case "show":
		method = http.MethodGet
	case "delete":
		method = http.MethodDelete
	case "create":
		if *file == "" {
			fmt.Fprintln(stderr, "changegate subscriptions create: -f FILE is required (- for standard input)")
			return 2
		}
		if body, err = readBody(*file); err != nil {
			fmt.Fprintf(stderr, "changegate subscriptions create: %v\n", err)
			return 2
		}
		secret = true
	case "pause":
		path += "/pause"
		if *reason != "" {
			body, _ = json.Marshal(map[string]string{"reason": *reason})
		}
	case "resume":
		path += "/resume"
	case "rotate-secret":
		path += "/rotate-secret"
		if *overlap != "" {
			body, _ = json.Marshal(map[string]string{"overlap": *overlap})
		}
		secret = true
	}
	out, status, err := c.do(method, path, body)
	if err != nil {
		fmt.Fprintf(stderr, "changegate subscriptions %s: %v\n", sub, err)
		return 1
	}
	if status < 200 || status > 299 {
		fmt.Fprintf(stderr, "changegate subscriptions %s: %d %s\n", sub, status, apiError(out))
		return 1
	}
	if sub == "list" {
		return printPage(out, stdout, stderr)
	}
	var v bytes.Buffer
	if json.Indent(&v, out, "", "  ") != nil {
		v.Reset()
		v.Write(out)
	}
	fmt.Fprintln(stdout, strings.TrimSpace(v.String()))
	if secret {
		fmt.Fprintln(stderr, "the signing secret above is shown this once: store it now (the API never shows it again)")
	}
	return 0
}

func needsName(sub string) bool { return sub != "list" && sub != "create" }

func readBody(file string) ([]byte, error) {
	if file == "-" {
		return io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	}
	return os.ReadFile(file)
}

func newAPIClient(base, tokenFile string) (*apiClient, error) {
	if base == "" {
		base = os.Getenv("CHANGEGATE_API_URL")
	}
	if base == "" {
		base = "http://127.0.0.1:9464"
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("-api %q: want an http:// or https:// URL", base)
	}
	token := os.Getenv("CHANGEGATE_API_TOKEN")
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("-token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		return nil, fmt.Errorf("no API token: set CHANGEGATE_API_TOKEN or -token-file FILE")
	}
	return &apiClient{base: strings.TrimRight(base, "/"), token: token, client: &http.Client{Timeout: 30 * time.Second}}, nil
}

// do sends one request and returns the answer's body (at most 8 MiB).
func (c *apiClient) do(method, path string, body []byte) ([]byte, int, error) {
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if len(body) > 0 {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return out, resp.StatusCode, err
}

// apiError renders an api.Error answer: its error and each problem's path.
func apiError(out []byte) string {
	var e struct {
		Error    string `json:"error"`
		Problems []struct {
			Path    string `json:"path"`
			Message string `json:"message"`
		} `json:"problems"`
	}
	if json.Unmarshal(out, &e) != nil || e.Error == "" {
		return strings.TrimSpace(string(out))
	}
	s := e.Error
	for _, p := range e.Problems {
		s += fmt.Sprintf("\n  %s: %s", p.Path, p.Message)
	}
	return s
}

// printPage prints a listing's subscriptions one per line and its next
// cursor on stderr.
func printPage(out []byte, stdout, stderr io.Writer) int {
	var p struct {
		Subscriptions []json.RawMessage `json:"subscriptions"`
		Next          string            `json:"next"`
		Error         string            `json:"error"`
	}
	if err := json.Unmarshal(out, &p); err != nil {
		fmt.Fprintf(stderr, "changegate subscriptions list: %v\n", err)
		return 1
	}
	for _, s := range p.Subscriptions {
		var b bytes.Buffer
		if json.Compact(&b, s) == nil {
			fmt.Fprintln(stdout, b.String())
		}
	}
	if p.Error != "" {
		fmt.Fprintf(stderr, "changegate subscriptions list: the listing stopped: %s\n", p.Error)
		return 1
	}
	if p.Next != "" {
		fmt.Fprintf(stderr, "next: %s\n", p.Next)
	}
	return 0
}
