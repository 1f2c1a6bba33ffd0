# app/refunds.py
import os

from phrony import Client

client = Client(
    runtime_addr=os.environ.get("PHRONY_RUNTIME_ADDR", "127.0.0.1:7777"),
)


async def handle_refund_request(ticket_id: str, message: str) -> str:
    session = await client.run(
        "support/refund-agent",
        input=message,
        metadata={"ticket_id": ticket_id},
    )
    result = await session.wait()
    return result.output
