/* refract dispatcher ingress (tc cls_bpf, direct action) on the client-facing interface.
 *
 * Per flow (client -> VIP 4-tuple) in a HASH map (never LRU: an evicted entry would send the
 * flow to this host's stack, which resets it):
 *   FREEZE - drop the flow's packets while its socket is snapshotted (TC_ACT_SHOT);
 *   STEER  - rewrite the destination MAC to the agent's and the source MAC to our own (or the
 *            bridge learns the client's MAC on our port), then redirect out of `ifindex`
 *            (hairpin out of the same interface works).
 * Packets of flows without an entry, and anything not TCP over IPv4, get TC_ACT_UNSPEC: tc goes
 * on with the next filter on the interface (another dispatcher's program, whose flows these may
 * be), and passes the packet to the stack untouched if there is none. TC_ACT_OK would end the
 * chain there and hide every other dispatcher's flows from its program. */
#include "common.h"

#define ACT_FREEZE 1
#define ACT_STEER 2

/* Must match `FlowValue` in src/steering.rs. */
struct flow_val {
	__u32 action;
	__u32 ifindex;
	__u8 dmac[6];
	__u8 smac[6];
	__u32 pad;
	__u64 epoch;
	__u64 packets;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); /* replaced at load time from the configured capacity */
	__type(key, struct flow_key);
	__type(value, struct flow_val);
} flows SEC(".maps");

/* 0: packets dropped by FREEZE, 1: packets steered, 2: redirects that failed. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} ingress_stats SEC(".maps");

SEC("classifier") /* aya 0.13 knows tc programs by this section name */
int refract_ingress(struct __sk_buff *skb)
{
	struct ethhdr *eth;
	struct iphdr *ip;
	struct tcphdr *th;

	if (!parse_tcp4(skb, &eth, &ip, &th))
		return TC_ACT_UNSPEC;
	struct flow_key k = {
		.saddr = ip->saddr, .daddr = ip->daddr, .sport = th->source, .dport = th->dest,
	};
	struct flow_val *v = bpf_map_lookup_elem(&flows, &k);
	if (!v)
		return TC_ACT_UNSPEC; /* not ours: the next filter's, or the stack's */
	__sync_fetch_and_add(&v->packets, 1);
	if (v->action == ACT_FREEZE) {
		bump(&ingress_stats, 0);
		return TC_ACT_SHOT;
	}
	if (v->action == ACT_STEER) {
		__builtin_memcpy(eth->h_dest, v->dmac, 6);
		__builtin_memcpy(eth->h_source, v->smac, 6);
		long rc = bpf_redirect(v->ifindex, 0);
		bump(&ingress_stats, rc == TC_ACT_REDIRECT ? 1 : 2);
		return rc;
	}
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "GPL";
