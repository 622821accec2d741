// changegate console: live refresh, the admin token, and actions.
//
// The pages are rendered by the server (html/template escapes every value).
// This script never turns data into markup: a refresh parses the server's
// page with DOMParser (an inert document: its scripts never run) and moves
// its #content nodes into this page; messages are written with textContent.
// The admin token lives in sessionStorage (this tab only) and is sent as
// "Authorization: Bearer"; no cookie is ever used.
'use strict';

(function () {
  var KEY = 'changegate.adminToken';
  var body = document.body;

  function token() {
    try { return sessionStorage.getItem(KEY) || ''; } catch (e) { return ''; }
  }

  function flash(msg, bad) {
    var el = document.getElementById('flash');
    el.textContent = msg;
    el.className = bad ? 'bad' : 'ok';
  }

  function showTokenState() {
    var el = document.getElementById('token-state');
    if (el) { el.textContent = token() ? 'token set for this tab' : 'no token'; }
  }

  function authHeaders(h) {
    var t = token();
    if (t) { h.Authorization = 'Bearer ' + t; }
    return h;
  }

  // refresh fetches this page again (with the token, if any) and swaps its
  // content in. It resolves to true when data was shown.
  var refreshing = false;
  function refresh() {
    if (refreshing) { return Promise.resolve(false); }
    refreshing = true;
    return fetch(location.pathname + location.search, {
      headers: authHeaders({ 'Accept': 'text/html' }), cache: 'no-store', credentials: 'omit'
    }).then(function (resp) {
      return resp.text();
    }).then(function (html) {
      var doc = new DOMParser().parseFromString(html, 'text/html');
      var next = doc.getElementById('content');
      if (!next) { return false; }
      if (doc.body.hasAttribute('data-locked')) {
        flash(token() ? 'The admin token was refused.' : 'Enter the admin token to see data.', !!token());
        return false;
      }
      var nodes = Array.prototype.slice.call(next.childNodes).map(function (n) { return document.adoptNode(n); });
      document.getElementById('content').replaceChildren.apply(document.getElementById('content'), nodes);
      body.removeAttribute('data-locked');
      body.setAttribute('data-refresh', doc.body.getAttribute('data-refresh') || '0');
      document.title = doc.title;
      schedule();
      return true;
    }).catch(function (err) {
      flash('Refresh failed: ' + err, true);
      return false;
    }).finally(function () { refreshing = false; });
  }

  // act sends an action: method, path, JSON body, the token, and extra
  // headers (If-Match) if any.
  function act(method, path, payload, describe, extra) {
    if (!token()) {
      flash('Actions need the admin token (subscriptions: or a [[server.tokens]] token): enter it above.', true);
      document.getElementById('token').focus();
      return Promise.resolve();
    }
    flash('Working…', false);
    var headers = authHeaders({ 'Content-Type': 'application/json', 'Accept': 'application/json' });
    Object.keys(extra || {}).forEach(function (k) { headers[k] = extra[k]; });
    return fetch(path, {
      method: method, credentials: 'omit', cache: 'no-store',
      headers: headers,
      body: JSON.stringify(payload)
    }).then(function (resp) {
      return resp.json().catch(function () { return {}; }).then(function (out) {
        if (!resp.ok) {
          var msg = (out && (out.error || (out.errors || []).join('; '))) || resp.statusText;
          if (out && out.problems) { msg += ': ' + out.problems.join('; '); }
          flash('Refused (' + resp.status + '): ' + msg, true);
          return;
        }
        flash(describe(out), false);
        return refresh();
      });
    }).catch(function (err) { flash('Request failed: ' + err, true); });
  }

  // filterPayload is the selection of the listing shown, as the server
  // rendered it (every filter, document_key_bson included, since made
  // absolute, until the time of the listing), not what may have been typed
  // in the form since.
  function filterPayload() {
    var form = document.getElementById('filter');
    try { return JSON.parse(form.getAttribute('data-selection') || '{}'); } catch (e) { return null; }
  }

  // describeFilter names a selection's filters for a confirmation.
  function describeFilter(p) {
    var parts = [];
    ['sink', 'source', 'kind', 'since', 'document_key', 'document_key_bson'].forEach(function (k) {
      if (p[k]) { parts.push(k + '=' + p[k]); }
    });
    return parts.length ? parts.join(', ') : 'no filter: every dead letter';
  }

  function replayed(out) {
    var msg = 'Replayed ' + (out.replayed || 0) + ', failed ' + (out.failed || 0) + ', skipped ' + (out.skipped || 0) + '.';
    if (out.errors && out.errors.length) { msg += ' ' + out.errors.join('; '); }
    return msg;
  }
  function purged(out) { return 'Purged ' + (out.purged || 0) + '.'; }

  // download fetches a whole dead letter from the API with the token and
  // saves it as a file (a plain link cannot send the bearer token).
  function download(link) {
    var id = link.getAttribute('data-download');
    flash('Downloading…', false);
    fetch(link.getAttribute('href'), {
      headers: authHeaders({ 'Accept': 'application/json' }), cache: 'no-store', credentials: 'omit'
    }).then(function (resp) {
      if (!resp.ok) { flash('Refused (' + resp.status + '): enter the admin token above.', true); return; }
      return resp.blob().then(function (b) {
        var a = document.createElement('a');
        a.href = URL.createObjectURL(b);
        a.download = id.replace(/[^A-Za-z0-9._-]/g, '_') + '.json';
        document.body.appendChild(a);
        a.click();
        a.remove();
        setTimeout(function () { URL.revokeObjectURL(a.href); }, 10000);
        flash('Downloaded.', false);
      });
    }).catch(function (err) { flash('Download failed: ' + err, true); });
  }

  // showSecret shows a subscription's signing secret, which the API
  // answers only on creation and rotation: written with textContent into
  // #secret-once (outside the refreshed content), kept nowhere else, and
  // removed from the page by "Done" or by leaving it.
  function showSecret(name, secret) {
    var box = document.getElementById('secret-once');
    var head = document.createElement('p');
    head.textContent = 'The signing secret of ' + name + ', shown this once (it cannot be shown again; rotate it if it is lost):';
    var code = document.createElement('code');
    code.id = 'secret-value';
    code.textContent = secret;
    var done = document.createElement('button');
    done.type = 'button';
    done.id = 'secret-done';
    done.textContent = 'Done: I have kept it';
    done.addEventListener('click', function () { box.replaceChildren(); box.hidden = true; });
    box.replaceChildren(head, code, document.createElement('br'), done);
    box.hidden = false;
  }

  function subscriptionPath(name, action) {
    return '/api/v1/subscriptions/' + encodeURIComponent(name) + (action ? '/' + action : '');
  }

  // subscriptionBody builds the JSON form of a subscription from the
  // create form; it throws an Error naming the field it cannot read.
  function subscriptionBody(form) {
    function v(n) { return (form.elements[n].value || '').trim(); }
    function list(x) { return x.split(',').map(function (s) { return s.trim(); }).filter(Boolean); }
    function json(n) {
      try { return JSON.parse(v(n)); } catch (e) { throw new Error(n + ': not JSON: ' + e.message); }
    }
    var body = { name: v('name'), source: v('source') };
    var ops = Array.prototype.filter.call(form.querySelectorAll('input[name="operations"]'), function (c) { return c.checked; })
      .map(function (c) { return c.value; });
    if (ops.length) { body.operations = ops; }
    if (v('filter')) { body.filter = json('filter'); }
    if (v('fields')) { body.fields = v('fields').charAt(0) === '{' ? json('fields') : list(v('fields')); }
    if (v('redact')) { body.redact = list(v('redact')); }
    if (v('envelope')) { body.envelope = v('envelope'); }
    var sink = { type: 'webhook', url: v('url') };
    if (v('headers')) {
      sink.headers = {};
      v('headers').split('\n').forEach(function (line) {
        if (!line.trim()) { return; }
        var i = line.indexOf(':');
        if (i <= 0) { throw new Error('headers: "' + line.trim().slice(0, 40) + '" is not "Name: value"'); }
        sink.headers[line.slice(0, i).trim()] = line.slice(i + 1).trim();
      });
    }
    if (v('batch_size')) { sink.batch_size = Number(v('batch_size')); }
    if (v('transactions')) { sink.transactions = v('transactions'); }
    if (v('max_in_flight')) { sink.max_in_flight = /^[0-9]+$/.test(v('max_in_flight')) ? Number(v('max_in_flight')) : v('max_in_flight'); }
    body.sink = sink;
    return body;
  }

  document.addEventListener('submit', function (ev) {
    var form = ev.target.closest('#subscription-create');
    if (!form) { return; }
    ev.preventDefault();
    var body;
    try { body = subscriptionBody(form); } catch (e) { flash('Not sent: ' + e.message, true); return; }
    act('POST', '/api/v1/subscriptions', body, function (out) {
      form.reset();
      if (out.secret) { showSecret(out.name, out.secret); }
      return 'Created ' + out.name + '.';
    });
  });

  document.addEventListener('click', function (ev) {
    var link = ev.target.closest('a[data-download]');
    if (link && token()) {
      ev.preventDefault();
      download(link);
      return;
    }
    var btn = ev.target.closest('button[data-action]');
    if (!btn) { return; }
    ev.preventDefault();
    var id = btn.getAttribute('data-id');
    switch (btn.getAttribute('data-action')) {
      case 'replay':
        act('POST', '/ui/api/replay', { ids: [id] }, replayed);
        break;
      case 'purge':
        if (window.confirm('Purge this dead letter? It cannot be replayed afterwards.')) {
          act('DELETE', '/ui/api/deadletters', { ids: [id] }, purged);
        }
        break;
      case 'replay-filter': {
        var rp = filterPayload();
        var rn = btn.getAttribute('data-count');
        if (!rp) { flash('The listing\'s filter cannot be read: reload the page.', true); break; }
        if (rn === '0') { flash('No failed dead letter matches: nothing to replay.', false); break; }
        if (window.confirm('Replay ' + rn + ' failed dead letter(s) (' + describeFilter(rp) + ')?')) {
          act('POST', '/ui/api/replay', rp, replayed);
        }
        break;
      }
      case 'purge-filter': {
        var p = filterPayload();
        var n = btn.getAttribute('data-count');
        if (!p) { flash('The listing\'s filter cannot be read: reload the page.', true); break; }
        if (n === '0') { flash('No dead letter matches: nothing to purge.', false); break; }
        var all = Object.keys(p).filter(function (k) { return k !== 'until'; }).length === 0;
        if (window.confirm((all ? 'Purge EVERY dead letter: ' : 'Purge ') + n + ' dead letter(s) (' + describeFilter(p) + ')? They cannot be replayed afterwards.')) {
          if (all) { p.all = true; }
          act('DELETE', '/ui/api/deadletters', p, purged);
        }
        break;
      }
      case 'sub-pause':
      case 'sub-resume': {
        var what = btn.getAttribute('data-action') === 'sub-pause' ? 'pause' : 'resume';
        var name = btn.getAttribute('data-name');
        act('POST', subscriptionPath(name, what), {}, function (out) { return (what === 'pause' ? 'Paused ' : 'Resumed ') + out.name + '.'; },
          { 'If-Match': '"' + btn.getAttribute('data-revision') + '"' });
        break;
      }
      case 'sub-rotate': {
        var sub = btn.getAttribute('data-name');
        if (window.confirm('Rotate the signing secret of ' + sub + '? The current one keeps signing for 24h.')) {
          act('POST', subscriptionPath(sub, 'rotate-secret'), {}, function (out) {
            if (out.secret) { showSecret(out.name, out.secret); }
            return 'Rotated the secret of ' + out.name + '.';
          }, { 'If-Match': '"' + btn.getAttribute('data-revision') + '"' });
        }
        break;
      }
      case 'redeliver': {
        var sink = btn.getAttribute('data-sink');
        if (window.confirm('Read this change again from the oplog and deliver it once more to ' + sink + ' (same event id)?')) {
          act('POST', '/api/v1/events/' + encodeURIComponent(id) + '/redeliver', { sink: sink }, function (out) {
            return 'Redelivered to ' + out.sink + ' (' + out.state + ').';
          });
        }
        break;
      }
      case 'reload':
        act('POST', '/ui/api/reload', {}, function () { return 'Configuration reloaded.'; });
        break;
    }
  });

  var form = document.getElementById('token-form');
  form.addEventListener('submit', function (ev) {
    ev.preventDefault();
    var input = document.getElementById('token');
    var t = input.value.trim();
    input.value = '';
    if (!t) { return; }
    try { sessionStorage.setItem(KEY, t); } catch (e) { flash('Cannot keep the token: ' + e, true); return; }
    showTokenState();
    flash('Token kept for this tab.', false);
    if (body.getAttribute('data-auth') === 'token' || body.hasAttribute('data-locked')) { refresh(); }
  });
  document.getElementById('token-forget').addEventListener('click', function () {
    try { sessionStorage.removeItem(KEY); } catch (e) { /* nothing kept */ }
    showTokenState();
    flash('Token forgotten.', false);
  });
  showTokenState();

  // schedule (re)arms the self-refresh the page asks for (data-refresh).
  var timer = null;
  var armed = 0;
  function schedule() {
    var every = parseInt(body.getAttribute('data-refresh'), 10) || 0;
    if (every === armed) { return; }
    if (timer) { clearInterval(timer); timer = null; }
    armed = every;
    if (every > 0) {
      timer = setInterval(function () {
        if (!document.hidden && !body.hasAttribute('data-locked')) { refresh(); }
      }, every * 1000);
    }
  }

  if (body.hasAttribute('data-locked') && token()) { refresh(); }
  schedule();
})();
