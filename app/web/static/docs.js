// /docs: start Swagger UI on this service's own OpenAPI document (a file, not inline: the page's CSP allows no inline script).
window.addEventListener("load", function () {
  var node = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({ url: node.getAttribute("data-url"), dom_id: "#swagger-ui", deepLinking: true });
});
