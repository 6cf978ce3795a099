# edge-pulse: Varnish as an edge cache whose varnishncsa log feeds pulse through the
# edge agent (`edge-agent --access-log-format varnishncsa_json`), and which takes the agent's
# pre-warm requests. Run with
#   varnishd -f /etc/varnish/edge.vcl -a 127.0.0.1:8082 ...
#   varnishncsa -D -P /run/varnishncsa-edge.pid -a -j -f /etc/varnish/varnishncsa.format \
#       -w /var/log/varnish/edge-pulse.json
# (-D: only a daemonised varnishncsa reopens its file on SIGHUP, for rename rotation;
# -a: it appends, so a copy-truncate leaves no hole where it wrote before).
# Change the backend marked "site:".
#
# Request collapsing is Varnish's waiting list, on by default: concurrent misses of
# one object (a pre-warm included) wait for one backend fetch. Nothing here turns it
# off (no `return (pass)` for cacheable requests; hit-for-miss only for responses the
# backend marks uncacheable).

vcl 4.1;

backend default {
    .host = "127.0.0.1";                        # site: the origin
    .port = "9000";
}

# The pre-warm marker counts only from the agent (loopback).
acl edge_pulse_agent {
    "127.0.0.1";
    "::1";
}

sub vcl_recv {
    if (req.http.X-Edge-Pulse-Prewarm) {
        if (client.ip ~ edge_pulse_agent && req.http.X-Edge-Pulse-Prewarm == "1") {
            set req.http.X-Edge-Pulse-Prewarm = "1";
        } else {
            unset req.http.X-Edge-Pulse-Prewarm;
        }
    }
    # Pre-warms are plain cacheable GETs: the builtin logic (lookup, waiting list)
    # goes on from here. Host and URL are the hash, as the agent's tenant map and key.
}

sub vcl_backend_fetch {
    # The marker never leaves the node.
    unset bereq.http.X-Edge-Pulse-Prewarm;
}
