// Tests of the deployment files: the configs they mount are valid, the
// manifests parse and agree with each other, with the Dockerfile and with
// the config, and the Grafana dashboard only queries metrics changegate
// exports. There is no Docker engine or cluster here: these are the checks
// that can run without one.
package deploy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/metrics"
)

// plannedMetrics may be queried by the dashboard before changegate exports
// them (none at the moment), with the labels they will have.
var plannedMetrics = map[string][]string{}

type obj = map[string]any

// get walks m along keys (map keys, or list indexes as ints).
func get(t *testing.T, m any, keys ...any) any {
	t.Helper()
	cur := m
	for i, k := range keys {
		switch k := k.(type) {
		case string:
			mm, ok := cur.(obj)
			if !ok {
				t.Fatalf("%v: not a mapping at %v", keys, keys[:i])
			}
			cur = mm[k]
		case int:
			l, ok := cur.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("%v: no item %d at %v", keys, k, keys[:i])
			}
			cur = l[k]
		}
		if cur == nil {
			t.Fatalf("%v: missing %v", keys, keys[:i+1])
		}
	}
	return cur
}

func str(t *testing.T, m any, keys ...any) string {
	t.Helper()
	s, ok := get(t, m, keys...).(string)
	if !ok {
		t.Fatalf("%v is not a string", keys)
	}
	return s
}

// readYAML decodes every document of a YAML file.
func readYAML(t *testing.T, name string) []obj {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	var docs []obj
	for {
		var doc obj
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", name, len(docs)+1, err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
}

// k8s returns the objects of the kubernetes/ manifests by kind.
func k8s(t *testing.T) map[string]obj {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	byKind := map[string]obj{}
	for _, f := range files {
		for _, d := range readYAML(t, f) {
			kind, _ := d["kind"].(string)
			if _, dup := byKind[kind]; dup {
				t.Fatalf("%s: second %s (the tests expect one of each kind)", f, kind)
			}
			byKind[kind] = d
		}
	}
	return byKind
}

// envRefs lists the ${VAR} and ${VAR:-default} references of a config file.
var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}`)

func requiredEnv(data []byte) []string {
	var vars []string
	for _, m := range envRef.FindAllSubmatch(data, -1) {
		if len(m[2]) == 0 {
			vars = append(vars, string(m[1]))
		}
	}
	return vars
}

func lookupIn(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

// parseConfig validates a config as `changegate check` does.
func parseConfig(t *testing.T, name string, data []byte, env map[string]string) *config.Config {
	t.Helper()
	cfg, err := config.Parse(name, data, lookupIn(env))
	if err == nil {
		_, err = app.CompileRules(cfg)
	}
	if err != nil {
		t.Fatalf("%s does not pass changegate check:\n%v", name, err)
	}
	return cfg
}

func listenPort(t *testing.T, cfg *config.Config) int {
	t.Helper()
	_, p, err := net.SplitHostPort(cfg.Server.Listen)
	if err != nil {
		t.Fatalf("server.listen %q: %v", cfg.Server.Listen, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("server.listen %q: %v", cfg.Server.Listen, err)
	}
	return port
}

// composeInterpolate resolves ${VAR}, ${VAR:-default} and $$ as docker
// compose does, with an empty environment (the defaults are what a plain
// `docker compose up` uses).
func composeInterpolate(s string) string {
	s = strings.ReplaceAll(s, "$$", "\x00")
	s = envRef.ReplaceAllStringFunc(s, func(m string) string {
		_, def, _ := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(m, "${"), "}"), ":-")
		return def
	})
	return strings.ReplaceAll(s, "\x00", "$")
}

// dockerfile is what the tests need from the Dockerfile's final stage.
type dockerfile struct {
	from, user      string
	entrypoint, cmd []string
	expose          []string
	healthcheck     bool
	receiverTarget  bool
	receiverCmd     []string
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var df dockerfile
	var stage string
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	args := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		jsonList := func() []string {
			var l []string
			if err := json.Unmarshal([]byte(rest), &l); err != nil {
				t.Fatalf("Dockerfile: %s must use the JSON (exec) form: %v", instr, err)
			}
			return l
		}
		switch strings.ToUpper(instr) {
		case "ARG":
			if stage == "" {
				k, v, _ := strings.Cut(rest, "=")
				args[k] = v
			}
		case "FROM":
			f := strings.Fields(rest)
			if len(f) < 3 || !strings.EqualFold(f[len(f)-2], "AS") {
				t.Fatalf("Dockerfile: every stage should be named: %q", line)
			}
			from := f[len(f)-3]
			stage = f[len(f)-1]
			if strings.HasPrefix(from, "${") {
				from = args[strings.Trim(from, "${}")]
			}
			df = dockerfile{receiverTarget: df.receiverTarget || stage == "receiver", receiverCmd: df.receiverCmd, from: from}
		case "USER":
			df.user = rest
		case "ENTRYPOINT":
			df.entrypoint = jsonList()
		case "CMD":
			df.cmd = jsonList()
			if stage == "receiver" {
				df.receiverCmd = df.cmd
			}
		case "EXPOSE":
			df.expose = append(df.expose, strings.Fields(rest)...)
		case "HEALTHCHECK":
			df.healthcheck = true
		}
	}
	return df
}

// configFlag returns the value of -config in a command line.
func configFlag(t *testing.T, cmd []string) string {
	t.Helper()
	i := slices.Index(cmd, "-config")
	if i < 0 || i+1 >= len(cmd) {
		t.Fatalf("no -config in %q", cmd)
	}
	return cmd[i+1]
}

func TestDockerfile(t *testing.T) {
	df := readDockerfile(t)
	if !strings.HasPrefix(df.from, "gcr.io/distroless/static") || !strings.HasSuffix(df.from, ":nonroot") {
		t.Errorf("final stage FROM %q, want distroless static nonroot", df.from)
	}
	if uid, _, _ := strings.Cut(df.user, ":"); uid == "" || uid == "0" || uid == "root" {
		t.Errorf("final stage USER %q, want a non-root uid", df.user)
	}
	if !slices.Equal(df.entrypoint, []string{"/changegate"}) {
		t.Errorf("ENTRYPOINT %q", df.entrypoint)
	}
	if len(df.cmd) == 0 || df.cmd[0] != "run" || configFlag(t, df.cmd) != "/etc/changegate/config.toml" {
		t.Errorf("CMD %q, want run -config /etc/changegate/config.toml", df.cmd)
	}
	if !slices.Contains(df.expose, "9464") {
		t.Errorf("EXPOSE %q, want 9464", df.expose)
	}
	if df.healthcheck {
		t.Error("HEALTHCHECK in the final stage: distroless has no shell or client to run it; use the /healthz and /readyz probes")
	}
	if !df.receiverTarget {
		t.Error("no receiver stage (compose.yaml builds target receiver)")
	}
}

func TestComposeConfig(t *testing.T) {
	docs := readYAML(t, "compose.yaml")
	if len(docs) != 1 {
		t.Fatalf("compose.yaml: %d documents", len(docs))
	}
	c := docs[0]
	services := get(t, c, "services").(obj)
	for _, s := range []string{"mongo", "changegate", "receiver"} {
		if services[s] == nil {
			t.Fatalf("compose.yaml: no %s service", s)
		}
	}

	// MongoDB: a replica set initiated by the health check, which changegate waits for.
	mongoCmd := fmt.Sprint(get(t, services, "mongo", "command"))
	if !strings.Contains(mongoCmd, "--replSet rs0") {
		t.Errorf("mongo command %s: not a replica set", mongoCmd)
	}
	health := fmt.Sprint(get(t, services, "mongo", "healthcheck", "test"))
	for _, want := range []string{"rs.status()", `rs.initiate({_id: "rs0"`, `host: "mongo:27017"`, "isWritablePrimary"} {
		if !strings.Contains(health, want) {
			t.Errorf("mongo healthcheck lacks %s: %s", want, health)
		}
	}
	if got := str(t, services, "changegate", "depends_on", "mongo", "condition"); got != "service_healthy" {
		t.Errorf("changegate depends on mongo %s, want service_healthy", got)
	}
	for svc, target := range map[string]string{"changegate": "changegate", "receiver": "receiver"} {
		if got := str(t, services, svc, "build", "target"); got != target {
			t.Errorf("%s builds target %q", svc, got)
		}
		if got := str(t, services, svc, "build", "context"); got != ".." {
			t.Errorf("%s build context %q, want the repository root", svc, got)
		}
	}

	// The mounted config is the one the image's CMD reads.
	df := readDockerfile(t)
	want := configFlag(t, df.cmd)
	if cmd, ok := get(t, services, "changegate").(obj)["command"]; ok {
		want = configFlag(t, toStrings(t, cmd))
	}
	var hostFile string
	for _, v := range get(t, services, "changegate", "volumes").([]any) {
		src, rest, _ := strings.Cut(v.(string), ":")
		if dst, _, _ := strings.Cut(rest, ":"); dst == want {
			hostFile = src
		}
	}
	if hostFile != "./changegate.toml" {
		t.Fatalf("compose mounts %q at %s, want ./changegate.toml", hostFile, want)
	}

	// The config passes `changegate check` with the environment compose sets.
	env := map[string]string{}
	for k, v := range get(t, services, "changegate", "environment").(obj) {
		env[k] = composeInterpolate(fmt.Sprint(v))
	}
	data, err := os.ReadFile("changegate.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range requiredEnv(data) {
		if _, ok := env[v]; !ok {
			t.Errorf("changegate.toml needs ${%s}; compose.yaml does not set it", v)
		}
	}
	cfg := parseConfig(t, "changegate.toml", data, env)
	if !strings.Contains(cfg.Mongo.URI.Value(), "replicaSet=rs0") {
		t.Errorf("mongo.uri %q: not the rs0 replica set", cfg.Mongo.URI.Value())
	}

	// The webhook reaches the receiver service, with the receiver's secret,
	// which needs allow_private_networks on the compose network.
	recvEnv := get(t, services, "receiver", "environment").(obj)
	for _, s := range cfg.Sinks {
		if s.Webhook == nil {
			continue
		}
		host := hostOf(t, s.Webhook.URL)
		if services[host] == nil {
			continue
		}
		if !s.Webhook.AllowPrivateNetworks {
			t.Errorf("sink %s targets compose service %s without allow_private_networks", s.Name, host)
		}
		if host == "receiver" {
			if got := composeInterpolate(fmt.Sprint(recvEnv["WEBHOOK_SECRET"])); len(s.Webhook.Secrets) != 1 || s.Webhook.Secrets[0].Value() != got {
				t.Errorf("sink %s and the receiver do not share WEBHOOK_SECRET", s.Name)
			}
			if !strings.HasSuffix(s.Webhook.URL, ":8080/hook") || !slices.Equal(df.receiverCmd, []string{"-listen", ":8080", "-path", "/hook"}) {
				t.Errorf("sink %s URL %s does not match the receiver's command %q", s.Name, s.Webhook.URL, df.receiverCmd)
			}
		}
	}

	// Docker stops the container after stop_grace_period: it must outlast the drain.
	stop, err := time.ParseDuration(str(t, services, "changegate", "stop_grace_period"))
	if err != nil {
		t.Fatal(err)
	}
	if stop <= cfg.Server.ShutdownGrace {
		t.Errorf("stop_grace_period %s <= shutdown_grace %s", stop, cfg.Server.ShutdownGrace)
	}
	ports := fmt.Sprint(get(t, services, "changegate", "ports"))
	if !strings.Contains(ports, fmt.Sprintf(":%d", listenPort(t, cfg))) {
		t.Errorf("changegate ports %s do not publish server.listen %s", ports, cfg.Server.Listen)
	}
}

func hostOf(t *testing.T, rawURL string) string {
	t.Helper()
	_, rest, _ := strings.Cut(rawURL, "://")
	hostPort, _, _ := strings.Cut(rest, "/")
	if h, _, err := net.SplitHostPort(hostPort); err == nil {
		return h
	}
	return hostPort
}

func toStrings(t *testing.T, v any) []string {
	t.Helper()
	l, ok := v.([]any)
	if !ok {
		t.Fatalf("%v is not a list", v)
	}
	out := make([]string, len(l))
	for i, e := range l {
		out[i] = fmt.Sprint(e)
	}
	return out
}

func TestYAMLFilesParse(t *testing.T) {
	n := 0
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (path.Ext(p) != ".yaml" && path.Ext(p) != ".yml") {
			return err
		}
		n++
		if docs := readYAML(t, p); len(docs) == 0 {
			t.Errorf("%s: no documents", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 7 {
		t.Errorf("found %d YAML files under deploy/", n)
	}
}

func TestKubernetesManifests(t *testing.T) {
	files, _ := filepath.Glob("kubernetes/*.yaml")
	var resources []string
	for _, f := range files {
		for _, d := range readYAML(t, f) {
			kind, _ := d["kind"].(string)
			if d["apiVersion"] == nil || kind == "" {
				t.Errorf("%s: object without apiVersion or kind", f)
				continue
			}
			if kind == "Kustomization" {
				resources = toStrings(t, d["resources"])
				continue
			}
			md, _ := d["metadata"].(obj)
			if name, _ := md["name"].(string); name == "" {
				t.Errorf("%s: %s without metadata.name", f, kind)
			}
			if md["namespace"] != nil {
				t.Errorf("%s: %s sets a namespace; the manifests are namespace-agnostic", f, kind)
			}
		}
	}
	var others []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			others = append(others, b)
		}
	}
	slices.Sort(resources)
	if !slices.Equal(resources, others) {
		t.Errorf("kustomization resources %q, files %q", resources, others)
	}

	objs := k8s(t)
	for _, kind := range []string{"ConfigMap", "Secret", "Deployment", "Service", "ServiceMonitor"} {
		if objs[kind] == nil {
			t.Fatalf("no %s", kind)
		}
	}
	dep, cm, sec, svc, sm := objs["Deployment"], objs["ConfigMap"], objs["Secret"], objs["Service"], objs["ServiceMonitor"]
	if sm["apiVersion"] != "monitoring.coreos.com/v1" {
		t.Errorf("ServiceMonitor apiVersion %v", sm["apiVersion"])
	}

	pod := get(t, dep, "spec", "template", "spec").(obj)
	containers := get(t, pod, "containers").([]any)
	if len(containers) != 1 {
		t.Fatalf("%d containers", len(containers))
	}
	ctr := containers[0].(obj)

	// The ConfigMap's config passes `changegate check` with the environment
	// the Deployment provides (values: the Secret's placeholders, with a
	// valid webhook secret in place of the one meant to fail).
	cmName := str(t, cm, "metadata", "name")
	data := []byte(str(t, cm, "data", "config.toml"))
	secName := str(t, sec, "metadata", "name")
	secData := get(t, sec, "stringData").(obj)
	env := map[string]string{}
	for _, e := range get(t, ctr, "env").([]any) {
		e := e.(obj)
		ref := get(t, e, "valueFrom", "secretKeyRef").(obj)
		if ref["name"] != secName || secData[ref["key"].(string)] == nil {
			t.Errorf("env %v refers to %v, not a key of Secret %s", e["name"], ref, secName)
		}
		env[e["name"].(string)] = fmt.Sprint(secData[ref["key"].(string)])
	}
	for _, v := range requiredEnv(data) {
		if _, ok := env[v]; !ok {
			t.Errorf("config.toml needs ${%s}; the Deployment does not set it", v)
		}
	}
	if _, err := config.Parse("configmap.yaml", data, lookupIn(env)); err == nil {
		t.Errorf("the Secret's placeholder WEBHOOK_SECRET %q is accepted; it should fail until replaced", env["WEBHOOK_SECRET"])
	}
	env["WEBHOOK_SECRET"] = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	cfg := parseConfig(t, "configmap.yaml", data, env)
	port := listenPort(t, cfg)
	// The config map says reads of data need the token: the API's and the
	// console's.
	if cfg.Server.PublicRead || cfg.Server.ConsoleAuth != config.ConsoleAuthToken {
		t.Errorf("configmap: public_read %v, console_auth %q: the comment says reads need the token", cfg.Server.PublicRead, cfg.Server.ConsoleAuth)
	}

	// The config is mounted where the image's CMD reads it.
	df := readDockerfile(t)
	cfgPath := configFlag(t, df.cmd)
	if args, ok := ctr["args"]; ok {
		cfgPath = configFlag(t, toStrings(t, args))
	}
	if ctr["command"] != nil {
		t.Errorf("container overrides the ENTRYPOINT: %v", ctr["command"])
	}
	var mountedVolume string
	for _, m := range get(t, ctr, "volumeMounts").([]any) {
		m := m.(obj)
		if m["mountPath"] == path.Dir(cfgPath) && m["subPath"] == nil {
			mountedVolume = m["name"].(string)
			if m["readOnly"] != true {
				t.Errorf("config mount is not readOnly")
			}
		}
	}
	var mountedCM string
	for _, v := range get(t, pod, "volumes").([]any) {
		if v.(obj)["name"] == mountedVolume {
			mountedCM = str(t, v, "configMap", "name")
		}
	}
	if mountedCM != cmName {
		t.Errorf("%s is not ConfigMap %s (volume %q mounts ConfigMap %q)", path.Dir(cfgPath), cmName, mountedVolume, mountedCM)
	}
	if path.Base(cfgPath) != "config.toml" {
		t.Errorf("the image reads %s, the ConfigMap key is config.toml", cfgPath)
	}

	// Probes on the admin server's port.
	var metricsPort int
	for _, p := range get(t, ctr, "ports").([]any) {
		p := p.(obj)
		if p["name"] == "metrics" {
			metricsPort = p["containerPort"].(int)
		}
	}
	if metricsPort != port {
		t.Errorf("containerPort metrics %d, server.listen %s", metricsPort, cfg.Server.Listen)
	}
	resolve := func(p any) int {
		if p == "metrics" {
			return metricsPort
		}
		n, _ := p.(int)
		return n
	}
	for probe, want := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		if got := str(t, ctr, probe, "httpGet", "path"); got != want {
			t.Errorf("%s path %s, want %s", probe, got, want)
		}
		if got := resolve(get(t, ctr, probe, "httpGet", "port")); got != port {
			t.Errorf("%s port %d, server listens on %d", probe, got, port)
		}
	}

	// Termination grace outlasts the drain.
	// Replicas follow the config: in cluster mode several share the units
	// through leases (a rolling update is safe, and a disruption budget
	// keeps one up); without it, one reader per source, never two at once.
	replicas := get(t, dep, "spec", "replicas").(int)
	strategy := str(t, dep, "spec", "strategy", "type")
	pdb := objs["PodDisruptionBudget"]
	if cfg.Cluster.Enabled {
		if replicas < 2 || strategy != "RollingUpdate" || get(t, dep, "spec", "strategy", "rollingUpdate", "maxUnavailable") != 0 {
			t.Errorf("cluster mode: replicas %d, strategy %s; want >= 2, RollingUpdate with maxUnavailable 0", replicas, strategy)
		}
		if pdb == nil {
			t.Error("cluster mode without a PodDisruptionBudget")
		} else {
			if m := get(t, pdb, "spec", "minAvailable"); m != 1 {
				t.Errorf("PodDisruptionBudget minAvailable %v, want 1", m)
			}
			sel := get(t, pdb, "spec", "selector", "matchLabels").(obj)
			labels := get(t, dep, "spec", "template", "metadata", "labels").(obj)
			for k, v := range sel {
				if labels[k] != v {
					t.Errorf("PodDisruptionBudget selects %s=%v, the pods have %v", k, v, labels[k])
				}
			}
		}
		if cfg.Cluster.Instance == "" {
			t.Error("cluster mode without an instance name")
		}
	} else if replicas != 1 || strategy != "Recreate" {
		t.Errorf("without cluster mode: replicas %d, strategy %s; want 1, Recreate", replicas, strategy)
	}
	if g := get(t, pod, "terminationGracePeriodSeconds").(int); time.Duration(g)*time.Second <= cfg.Server.ShutdownGrace {
		t.Errorf("terminationGracePeriodSeconds %d <= shutdown_grace %s", g, cfg.Server.ShutdownGrace)
	}

	// Non-root, read-only, no capabilities, default seccomp.
	psc := get(t, pod, "securityContext").(obj)
	csc := get(t, ctr, "securityContext").(obj)
	if psc["runAsNonRoot"] != true && csc["runAsNonRoot"] != true {
		t.Error("runAsNonRoot is not set")
	}
	for _, sc := range []obj{psc, csc} {
		if uid, ok := sc["runAsUser"]; ok && uid == 0 {
			t.Error("runAsUser 0")
		}
	}
	if csc["readOnlyRootFilesystem"] != true || csc["allowPrivilegeEscalation"] != false {
		t.Errorf("container securityContext %v", csc)
	}
	if drop := fmt.Sprint(get(t, csc, "capabilities", "drop")); drop != "[ALL]" {
		t.Errorf("capabilities drop %s, want [ALL]", drop)
	}
	if str(t, psc, "seccompProfile", "type") != "RuntimeDefault" {
		t.Error("seccompProfile is not RuntimeDefault")
	}
	for _, k := range []string{"requests", "limits"} {
		for _, r := range []string{"cpu", "memory"} {
			get(t, ctr, "resources", k, r)
		}
	}

	// Service and ServiceMonitor find the pod and its metrics port.
	podLabels := get(t, dep, "spec", "template", "metadata", "labels").(obj)
	matches := func(sel, labels obj) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	if !matches(get(t, dep, "spec", "selector", "matchLabels").(obj), podLabels) {
		t.Error("Deployment selector does not match its pod labels")
	}
	if !matches(get(t, svc, "spec", "selector").(obj), podLabels) {
		t.Error("Service selector does not match the pod labels")
	}
	svcPort := get(t, svc, "spec", "ports", 0).(obj)
	if svcPort["name"] != "metrics" || svcPort["port"] != 9464 || resolve(svcPort["targetPort"]) != port {
		t.Errorf("Service port %v", svcPort)
	}
	if !matches(get(t, sm, "spec", "selector", "matchLabels").(obj), get(t, svc, "metadata", "labels").(obj)) {
		t.Error("ServiceMonitor selector does not match the Service labels")
	}
	ep := get(t, sm, "spec", "endpoints", 0).(obj)
	if ep["port"] != "metrics" || ep["path"] != "/metrics" {
		t.Errorf("ServiceMonitor endpoint %v", ep)
	}
}

// exportedMetrics returns changegate's metric families (and the Go and
// process collectors') with their variable labels, from the collectors'
// descriptions: a vector without children is not gathered, but it is
// described.
func exportedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	reg := &recorder{}
	metrics.New(reg)
	descRE := regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*variableLabels: \{([^}]*)\}\}$`)
	out := map[string][]string{}
	for _, c := range reg.collectors {
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descRE.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read %s", d)
			}
			var labels []string
			if m[2] != "" {
				labels = strings.Split(m[2], ",")
			}
			out[m[1]] = labels
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d metrics described", len(out))
	}
	return out
}

type recorder struct{ collectors []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}
func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}
func (r *recorder) Unregister(prometheus.Collector) bool { return false }

// exprs collects every PromQL expression of the dashboard: panel targets and
// query variables.
func exprs(v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && (k == "expr" || k == "definition") {
				*out = append(*out, s)
			}
			if k == "query" {
				if q, ok := e.(map[string]any); ok {
					if s, ok := q["query"].(string); ok {
						*out = append(*out, s)
					}
				}
			}
			exprs(e, out)
		}
	case []any:
		for _, e := range v {
			exprs(e, out)
		}
	}
}

func TestDashboard(t *testing.T) {
	data, err := os.ReadFile("grafana/changegate-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	if v, _ := dash["schemaVersion"].(float64); v < 36 {
		t.Errorf("schemaVersion %v", dash["schemaVersion"])
	}
	vars := map[string]bool{}
	for _, v := range get(t, dash, "templating", "list").([]any) {
		vars[v.(map[string]any)["name"].(string)] = true
	}
	for _, v := range []string{"datasource", "source", "sink", "traces"} {
		if !vars[v] {
			t.Errorf("no $%s variable", v)
		}
	}
	// The delivery latency panel asks for the exemplars (trace ids) and
	// the dashboard links to the traces' data source.
	exemplars := 0
	for _, p := range get(t, dash, "panels").([]any) {
		for _, tg := range asSlice(p.(map[string]any)["targets"]) {
			tm := tg.(map[string]any)
			if e, _ := tm["expr"].(string); strings.Contains(e, "changegate_delivery_duration_seconds_bucket") && tm["exemplar"] == true {
				exemplars++
			}
		}
	}
	if exemplars == 0 {
		t.Error("no delivery duration query with exemplar = true")
	}
	if !strings.Contains(string(data), `/explore?`) || !strings.Contains(string(data), `${traces}`) {
		t.Error("no link to the $traces data source")
	}

	known := exportedMetrics(t)
	var all []string
	exprs(dash, &all)
	if len(all) < 20 {
		t.Fatalf("only %d expressions found", len(all))
	}
	nameRE := regexp.MustCompile(`\b((?:changegate|go|process)_[a-z0-9_]+)\b(\{[^}]*\})?`)
	matcherRE := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	byRE := regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	used := map[string]bool{}
	for _, e := range all {
		labelsInExpr := map[string]bool{"job": true, "instance": true, "le": true}
		for _, m := range nameRE.FindAllStringSubmatch(e, -1) {
			name := m[1]
			labels, ok := known[name]
			if !ok {
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if base, cut := strings.CutSuffix(name, suf); cut {
						labels, ok = known[base]
						name = base
						break
					}
				}
			}
			if !ok {
				labels, ok = plannedMetrics[name]
			}
			if !ok {
				t.Errorf("%s is not a metric changegate exports (in %s)", m[1], e)
				continue
			}
			used[name] = true
			for _, l := range labels {
				labelsInExpr[l] = true
			}
			for _, lm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
				if l := lm[1]; l != "job" && l != "instance" && !slices.Contains(labels, l) {
					t.Errorf("%s has no label %s (in %s)", name, l, e)
				}
			}
		}
		for _, m := range byRE.FindAllStringSubmatch(e, -1) {
			for _, l := range strings.Split(m[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !labelsInExpr[l] {
					t.Errorf("grouping by %s, which no metric of the expression has (in %s)", l, e)
				}
			}
		}
	}

	// Every changegate metric has a panel.
	for name := range known {
		if strings.HasPrefix(name, "changegate_") && !used[name] {
			t.Errorf("no panel uses %s", name)
		}
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}
