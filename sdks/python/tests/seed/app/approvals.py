# app/approvals.py
from phrony import Client

client = Client(runtime_addr="127.0.0.1:7777")


async def pending_refund_approvals() -> list[dict]:
    approvals = await client.approvals.list(status="pending")
    return [
        {
            "id": a.id,
            "agent": a.agent_ref,          # support/refund-agent@0.1.0
            "tool": a.tool,                # payments.issue-refund
            "args": a.args,                # {"order_id": "ORD-1", "amount": 400, ...}
            "policy": a.policy_ref,        # payments/refund-approval-boundary@1.0.0
            "reason": a.reason,
        }
        for a in approvals
    ]


async def decide(approval_id: str, approve: bool, actor: str, comment: str) -> None:
    if approve:
        await client.approvals.approve(approval_id, actor=actor, comment=comment)
    else:
        await client.approvals.reject(approval_id, actor=actor, comment=comment)
