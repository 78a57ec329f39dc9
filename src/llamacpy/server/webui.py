"""The chat page served at ``/``: one self-contained HTML file that streams replies from
``/v1/chat/completions`` (no external resources)."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>llamacpy</title>
<style>
body{font-family:system-ui,sans-serif;max-width:48rem;margin:0 auto;padding:1rem;background:#fafafa}
#log{min-height:50vh}
.msg{white-space:pre-wrap;padding:.5rem .75rem;margin:.5rem 0;border-radius:.5rem}
.user{background:#dbeafe}.assistant{background:#fff;border:1px solid #ddd}
.error{background:#fee2e2}
form{display:flex;gap:.5rem}#input{flex:1;padding:.5rem}
#key{width:10rem}
</style></head>
<body>
<h1>llamacpy</h1>
<div id="log"></div>
<form id="form">
<input id="input" autocomplete="off" placeholder="Say something">
<input id="key" type="password" placeholder="API key (optional)">
<button id="send" type="submit">Send</button>
</form>
<script>
const log = document.getElementById("log"), form = document.getElementById("form");
const input = document.getElementById("input"), key = document.getElementById("key");
const messages = [];
function add(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role; div.textContent = text; log.appendChild(div); return div;
}
form.addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = input.value.trim(); if (!text) return;
  input.value = ""; add("user", text); messages.push({role: "user", content: text});
  const out = add("assistant", ""); let reply = "";
  const headers = {"Content-Type": "application/json"};
  if (key.value) headers["Authorization"] = "Bearer " + key.value;
  try {
    const res = await fetch("/v1/chat/completions", {method: "POST", headers,
      body: JSON.stringify({messages, stream: true})});
    if (!res.ok) { const j = await res.json(); throw new Error(j.error ? j.error.message : res.status); }
    const reader = res.body.getReader(), dec = new TextDecoder(); let buf = "";
    for (;;) {
      const {done, value} = await reader.read(); if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf("\\n\\n")) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!ev.startsWith("data: ")) continue;
        const data = ev.slice(6); if (data === "[DONE]") continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        const d = j.choices && j.choices[0] && j.choices[0].delta;
        if (d && d.content) { reply += d.content; out.textContent = reply; }
      }
    }
    out.dataset.done = "1";
    messages.push({role: "assistant", content: reply});
  } catch (err) { out.className = "msg error"; out.textContent = "Error: " + err.message; out.dataset.done = "1"; }
});
</script>
</body></html>
"""
